#!/usr/bin/env bash
# The OOM report's context and the OOM linger on a real GPU, with the
# exporter built here (.bin/compare/gpumem_exporter[.gz]), default flags:
# oom_context.py raises a real OutOfMemoryError in PyTorch and compares the
# report's context with the truth; then, once that process has exited, its
# gpumem_allocator_ooms_total series must stay on /metrics for
# --allocstats.oom-linger (1m) and go after, while its memory series go at
# once. From the repository root:  OUT=/tmp/linger bash scripts/gpu/oom_linger.sh
set -u
OUT=${OUT:-/tmp/gpumem-linger}
BIN=${BIN:-.bin/compare}
mkdir -p "$OUT" /run/gpumem
T=$(mktemp -d)
if [ -f "$BIN/gpumem_exporter.gz" ]; then gunzip -c "$BIN/gpumem_exporter.gz" >"$T/gpumem_exporter"; else cp "$BIN/gpumem_exporter" "$T/"; fi
chmod +x "$T/gpumem_exporter"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python GPUMEM_INTERVAL=1
URL=http://127.0.0.1:9481
"$T/gpumem_exporter" --allocstats.socket=/run/gpumem/allocstats.sock >"$OUT/exporter.log" 2>&1 &
EXP=$!
for _ in $(seq 100); do python3 -c "import urllib.request as u; u.urlopen('$URL/-/ready')" 2>/dev/null && break; sleep 0.1; done
"$T/gpumem_exporter" --version 2>&1 | head -1

python3 scripts/gpu/oom_context.py $URL >"$OUT/oom_context.txt" 2>&1 &
PY=$!
wait $PY
tail -20 "$OUT/oom_context.txt"
echo "pid $PY exited; its series on /metrics, by seconds after the exit:"
python3 - "$URL" "$PY" <<'PYEOF' | tee "$OUT/linger.txt"
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
python3 -c "import urllib.request,sys; open(sys.argv[2],'wb').write(urllib.request.urlopen(sys.argv[1]+'/api/v1/oom-reports').read())" "$URL" "$OUT/oom-reports.json"
kill $EXP; wait $EXP 2>/dev/null
grep -hE 'level=(error|warn)' "$OUT/exporter.log" | head -5
rm -rf "$T"
