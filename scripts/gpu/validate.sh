#!/usr/bin/env bash
# One validation run on a GPU machine (see docs/validation.md). Run from the
# repository root with the exporter and the nvml test binary built into .bin/:
#   make build && cp gpumem_exporter .bin/ && go test -c -o .bin/nvml.test ./nvml/
#   OUT=/tmp/out bash scripts/gpu/validate.sh
set -u
OUT=${OUT:-/tmp/gpumem-validation}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
# The default socket, which clients find without GPUMEM_SOCKET.
SOCK=/run/gpumem/allocstats.sock
export GPUMEM_INTERVAL=0.2
URL=http://127.0.0.1:9481

section() { echo; echo "=== $* ==="; }
section environment
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
uname -r

section exporter
.bin/gpumem_exporter --nvml.poll-interval=200ms --allocstats.socket=$SOCK --log.level=debug >"$OUT/exporter.log" 2>&1 &
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
python3 scripts/gpu/seed_experiments.py | tee "$OUT/seed.md"

section "workload labels of a plain VM process"
python3 scripts/gpu/hold.py 3072 & HOLD=$!
sleep 6
cat /proc/$HOLD/cgroup
python3 -c "import urllib.request as u; [print(l) for l in u.urlopen('$URL/metrics').read().decode().splitlines() if 'pid=\"$HOLD\"' in l and ('process_info' in l or 'process_memory_used' in l or 'context' in l)]"
section "nvidia-smi vs exporter with a process holding 3 GiB"
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free,memory.reserved --format=csv,noheader,nounits
nvidia-smi --query-compute-apps=pid,gpu_uuid,process_name,used_memory --format=csv,noheader,nounits
python3 -c "import urllib.request as u; [print(l) for l in u.urlopen('$URL/metrics').read().decode().splitlines() if l.startswith(('gpumem_gpu_', 'gpumem_process_memory_used', 'gpumem_nvml_up'))]"

section "scrape latency, one process"
python3 scripts/gpu/scrape_bench.py $URL/metrics $EXP 100
section "NVML benchmarks, one process"
GPUMEM_REAL_NVML=1 .bin/nvml.test -test.run='^$' -test.bench=Real -test.benchtime=2000x 2>&1 | grep -E '^Benchmark'

section "16 processes"
PIDS=""
for i in $(seq 15); do python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 & PIDS="$PIDS $!"; done
for _ in $(seq 60); do n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l); [ "$n" -ge 16 ] && break; sleep 1; done
echo "processes on the GPU: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
sleep 2
GPUMEM_REAL_NVML=1 .bin/nvml.test -test.run='^$' -test.bench=Real -test.benchtime=500x 2>&1 | grep -E '^Benchmark'
python3 scripts/gpu/scrape_bench.py $URL/metrics $EXP 100
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

section "two processes sharing the GPU (the part of two_gpus.py one GPU allows)"
kill $HOLD $PIDS 2>/dev/null; wait $HOLD $PIDS 2>/dev/null; sleep 1
python3 scripts/gpu/two_gpus.py

section "JAX and CuPy clients"
python3 scripts/gpu/frameworks.py jax 2>&1 | grep -v "^WARNING\|^I0000\|^E0000" | tail -8
python3 scripts/gpu/frameworks.py cupy 2>&1 | tail -8

python3 -c "import urllib.request as u; open('$OUT/metrics.txt','wb').write(u.urlopen('$URL/metrics').read()); open('$OUT/landing.html','wb').write(u.urlopen('$URL/').read()); open('$OUT/oom-reports.json','wb').write(u.urlopen('$URL/api/v1/oom-reports').read())"
kill $HOLD $PIDS 2>/dev/null
section "exporter log: errors and warnings"
grep -E 'level=(error|warn)' "$OUT/exporter.log" | head -20 || true
echo "(end of errors and warnings)"
kill $EXP
wait $EXP 2>/dev/null
cp "$OUT/exporter.log" "$OUT/exporter.log" 2>/dev/null
