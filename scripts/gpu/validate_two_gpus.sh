#!/usr/bin/env bash
# Two-GPU validation (needs the nvidia-h200-x2 device kind). From the repo
# root with the exporter in .bin/ (see validate.sh):
#   OUT=/tmp/out bash scripts/gpu/validate_two_gpus.sh
set -u
OUT=${OUT:-/tmp/gpumem-validation}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
# The default socket, which clients find without GPUMEM_SOCKET.
SOCK=/run/gpumem/allocstats.sock
export GPUMEM_INTERVAL=0.2
nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv
.bin/gpumem_exporter --nvml.poll-interval=200ms --allocstats.socket=$SOCK >"$OUT/exporter.log" 2>&1 &
EXP=$!
for _ in $(seq 50); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:9481/-/ready')" 2>/dev/null && break; sleep 0.2; done
python3 scripts/gpu/two_gpus.py | tee "$OUT/two_gpus.md"
grep -E 'level=(error|warn)' "$OUT/exporter.log" | head -20
kill $EXP; wait $EXP 2>/dev/null
