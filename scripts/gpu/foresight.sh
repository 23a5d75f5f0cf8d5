#!/usr/bin/env bash
# Does the daemon warn a job before it dies of an OOM, on a real GPU? One
# run of about 8 minutes on one GPU: the exporter (real NVML) beside five
# PyTorch processes at once (`scripts/gpu/workloads.py foresight`): a
# 95-second leak, a 7-minute leak, 5 minutes of steady training, an
# evaluation without torch.no_grad() and a request larger than the GPU. Each process's
# stderr (the warning and the verdict the client printed), its record of
# when it was warned and when it failed, its checkpoint, the exporter's
# OOM reports and a scrape of gpumem_allocator_time_to_oom_seconds every
# 15 s land in $OUT; the summary at the end says, for each process, how
# long before its OOM it was warned and when GPUWorkloadOOMRisk (a
# threshold of 10 minutes on that gauge) would have fired at a 15 s scrape
# and evaluation. docs/validation.md reads it. Needs root, python3 with
# torch; the binary from scripts/gpu/build.sh in $BIN (default .bin).
#   OUT=/tmp/gpumem-foresight bash scripts/gpu/foresight.sh
# KINDS="eval too_large" runs only those workloads.
set -u
. scripts/lib.sh
OUT=${OUT:-/tmp/gpumem-foresight}
BIN=${BIN:-.bin}
mkdir -p "$OUT" /run/gpumem
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
unpack "$BIN/gpumem_exporter" "$WORK/gpumem_exporter" || exit 1
URL=http://127.0.0.1:9481

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'
"$WORK/gpumem_exporter" --allocstats.socket=/run/gpumem/allocstats.sock >"$OUT/exporter.log" 2>&1 &
for _ in $(seq 50); do python3 -c "import urllib.request as u; u.urlopen('$URL/-/ready')" 2>/dev/null && break; sleep 0.2; done

# The gauge every 15 s, as Prometheus would scrape it.
( while :; do
	echo "# $(date +%s.%N)"
	python3 -c "import urllib.request as u; print(u.urlopen('$URL/metrics').read().decode())" | grep '^gpumem_allocator_time_to_oom_seconds'
	sleep 15
done ) >"$OUT/scrapes.txt" 2>/dev/null &

pids=()
for kind in ${KINDS:-leak95 leak7m steady eval too_large}; do
	python3 scripts/gpu/workloads.py foresight $kind "$OUT" >"$OUT/$kind.stdout" 2>"$OUT/$kind.stderr" &
	pids+=($!)
done
wait "${pids[@]}"
sleep 3
python3 -c "import urllib.request as u; print(u.urlopen('$URL/api/v1/oom-reports').read().decode())" >"$OUT/oom-reports.json"
python3 scripts/gpu/workloads.py foresight-summary "$OUT" | tee "$OUT/summary.md"
