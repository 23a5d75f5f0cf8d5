#!/usr/bin/env bash
# Does the exporter tell the truth on a real GPU? One run, one or more
# GPUs, about two minutes; docs/validation.md reads its output. It starts
# the exporter (real NVML, --nvml.poll-interval=200ms, the default
# socket, so that clients find it without GPUMEM_SOCKET), then checks, in
# order: the client creates no CUDA context on a device the process did
# not use; the seed article's allocator experiments read back through
# /metrics equal torch.cuda.memory_stats() and NVML (workloads.py seed-experiments);
# a plain process's workload labels; every GPU and process value against
# nvidia-smi; scrape latency and the NVML benchmarks at 1 and at 16
# processes; the Python client's cost per push; processes sharing a GPU
# and, where there are two, processes spread over GPUs (workloads.py two-gpus);
# JAX and CuPy clients (workloads.py frameworks) and their OOMs' reports
# and verdicts (oom_causes.py --frameworks); an OOM report's context
# against the truth (workloads.py oom-context); and that an exited process's OOM counter stays
# --allocstats.oom-linger (1m) while its memory series go at once.
# Needs root, python3 with torch (jax and cupy where present). Binaries in
# $BIN (default .bin, gzipped or not): gpumem_exporter and nvmlpoll.test,
# from scripts/gpu/build.sh. From the repository root:
#   OUT=/tmp/gpumem-validation bash scripts/gpu/validate.sh
# LINGER=0 skips the linger check (its 80 s).
set -u
. scripts/lib.sh
OUT=${OUT:-/tmp/gpumem-validation}
BIN=${BIN:-.bin}
LINGER=${LINGER:-1}
mkdir -p "$OUT" /run/gpumem
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
# The default socket, which clients find without GPUMEM_SOCKET.
SOCK=/run/gpumem/allocstats.sock
export GPUMEM_INTERVAL=0.2
URL=http://127.0.0.1:9481
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
unpack "$BIN/gpumem_exporter" "$WORK/gpumem_exporter" || exit 1
unpack "$BIN/nvmlpoll.test" "$WORK/nvmlpoll.test" || exit 1

section() { echo; echo "=== $* ==="; }
section environment
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
host_line
"$WORK/gpumem_exporter" --version 2>&1 | head -1

section exporter
"$WORK/gpumem_exporter" --nvml.poll-interval=200ms --allocstats.socket=$SOCK --log.level=debug >"$OUT/exporter.log" 2>&1 &
EXP=$!
for _ in $(seq 50); do python3 -c "import urllib.request as u; u.urlopen('$URL/-/ready')" 2>/dev/null && break; sleep 0.2; done
echo "exporter pid $EXP ready"

section "client creates no context on a device the process did not use"
python3 - <<'PY'
import os, subprocess, time, torch, gpumem
gpumem.start()
time.sleep(1.5)
apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True).stdout.split()
print("process imported torch, ran gpumem.start() and never used CUDA; listed by NVML:", str(os.getpid()) in apps)
PY

section "seed experiments"
python3 scripts/gpu/workloads.py seed-experiments | tee "$OUT/seed.md"

section "workload labels of a plain VM process"
python3 scripts/gpu/workloads.py hold 3072 & HOLD=$!
sleep 6
cat /proc/$HOLD/cgroup
python3 -c "import urllib.request as u; [print(l) for l in u.urlopen('$URL/metrics').read().decode().splitlines() if 'pid=\"$HOLD\"' in l and ('process_info' in l or 'process_memory_used' in l or 'context' in l)]"
section "nvidia-smi vs exporter with a process holding 3 GiB"
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free,memory.reserved --format=csv,noheader,nounits
nvidia-smi --query-compute-apps=pid,gpu_uuid,process_name,used_memory --format=csv,noheader,nounits
python3 -c "import urllib.request as u; [print(l) for l in u.urlopen('$URL/metrics').read().decode().splitlines() if l.startswith(('gpumem_gpu_', 'gpumem_process_memory_used', 'gpumem_nvml_up'))]"

section "scrape latency, one process"
python3 scripts/measure.py scrapes $URL/metrics $EXP 100 plain
section "NVML benchmarks, one process"
GPUMEM_REAL_NVML=1 "$WORK/nvmlpoll.test" -test.run='^$' -test.bench=Real -test.benchtime=2000x 2>&1 | grep -E '^Benchmark'

section "16 processes"
PIDS=""
for i in $(seq 15); do python3 scripts/gpu/workloads.py hold 256 >/dev/null 2>&1 & PIDS="$PIDS $!"; done
for _ in $(seq 60); do n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l); [ "$n" -ge 16 ] && break; sleep 1; done
echo "processes on the GPU: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
sleep 2
GPUMEM_REAL_NVML=1 "$WORK/nvmlpoll.test" -test.run='^$' -test.bench=Real -test.benchtime=500x 2>&1 | grep -E '^Benchmark'
python3 scripts/measure.py scrapes $URL/metrics $EXP 100 plain
python3 -c "import urllib.request as u; t=u.urlopen('$URL/metrics').read().decode(); print('allocator series:', sum(1 for l in t.splitlines() if l.startswith('gpumem_allocator_reserved_bytes')), 'context series:', sum(1 for l in t.splitlines() if l.startswith('gpumem_process_context_bytes')))"

section "client cost per push"
python3 - <<'PY'
import time, torch, gpumem
x = torch.ones(1024, device="cuda")
gpumem.collect()
n = 2000
t = time.perf_counter()
for _ in range(n):
    gpumem.collect()
dt = (time.perf_counter() - t) / n
print("gpumem.collect() (hello + stats for one device, JSON encoded): %.1f us per call" % (dt * 1e6))
t = time.perf_counter()
for _ in range(n):
    torch.cuda.memory_stats(0)
print("torch.cuda.memory_stats(0) alone: %.1f us per call" % ((time.perf_counter() - t) / n * 1e6))
PY

section "processes sharing a GPU, and spread over GPUs where there are two (workloads.py two-gpus)"
kill $HOLD $PIDS 2>/dev/null; wait $HOLD $PIDS 2>/dev/null; sleep 1
python3 scripts/gpu/workloads.py two-gpus | tee "$OUT/two_gpus.md"

section "JAX and CuPy clients"
python3 scripts/gpu/workloads.py frameworks jax 2>&1 | grep -v "^WARNING\|^I0000\|^E0000" | tail -8
python3 scripts/gpu/workloads.py frameworks cupy 2>&1 | tail -8

section "JAX and CuPy processes that die of an OOM (oom_causes.py --frameworks)"
python3 scripts/gpu/oom_causes.py --frameworks --exporter "$WORK/gpumem_exporter" --out "$OUT/oom_frameworks" 2>&1 | tee "$OUT/oom_frameworks.md"

section "the OOM report's context against the truth"
python3 scripts/gpu/workloads.py oom-context $URL >"$OUT/oom_context.txt" 2>&1 &
OOMPID=$!
wait $OOMPID
tail -20 "$OUT/oom_context.txt"

if [ "$LINGER" = 1 ]; then
	section "the exited process's series, by seconds after its exit (--allocstats.oom-linger=1m)"
	python3 - "$URL" "$OOMPID" <<'PYEOF' | tee "$OUT/linger.txt"
import re, sys, time, urllib.request
url, pid = sys.argv[1], sys.argv[2]
exited = time.time()
for _ in range(16):
    body = urllib.request.urlopen(url + "/metrics").read().decode()
    mine = [l for l in body.splitlines() if not l.startswith("#") and 'pid="%s"' % pid in l]
    ooms = [l.split()[-1] for l in mine if l.startswith("gpumem_allocator_ooms_total{")]
    info = sum(l.startswith("gpumem_process_info{") for l in mine)
    mem = sum(bool(re.match(r"gpumem_(allocator_(reserved|active)_bytes|process_memory_used_bytes)\{", l)) for l in mine)
    print("%5.1f s: ooms_total=%s process_info=%d memory_series=%d" % (time.time() - exited, ",".join(ooms) or "absent", info, mem))
    time.sleep(5)
PYEOF
fi

python3 -c "import urllib.request as u; open('$OUT/metrics.txt','wb').write(u.urlopen('$URL/metrics').read()); open('$OUT/landing.html','wb').write(u.urlopen('$URL/').read()); open('$OUT/oom-reports.json','wb').write(u.urlopen('$URL/api/v1/oom-reports').read())"
section "exporter log: errors and warnings"
grep -E 'level=(error|warn)' "$OUT/exporter.log" | head -20 || true
echo "(end of errors and warnings)"
kill $EXP
wait $EXP 2>/dev/null
