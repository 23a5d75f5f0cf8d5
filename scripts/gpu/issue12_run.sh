#!/usr/bin/env bash
# Issue 12's figures in one device call (about 6 minutes): the side by side
# with nvidia_gpu_exporter (compare_peers.sh), the CPU floor of NVML's data
# calls at a 1 s poll (nvml_idle.py, nothing else running), and the ingest
# benchmark (200 clients, one and 64 lines a write) at GOMAXPROCS 1, 2, 4
# on the GPU machine's CPUs. Needs in .bin/compare/ (gzipped or not):
# gpumem_exporter, nvidia_gpu_exporter, nvmlpoll.test, allocstats.test;
# docs/benchmarks.md says how to build them. From the repository root:
#   OUT=/tmp/issue12 bash scripts/gpu/issue12_run.sh
set -u
OUT=${OUT:-/tmp/issue12}
BIN=${BIN:-.bin/compare}
mkdir -p "$OUT" /run/gpumem
OUT=$OUT bash scripts/gpu/compare_peers.sh 2>&1 | tee "$OUT/compare.log" | tail -40

echo "=== NVML data calls alone, 1 s apart, 30 s ($(date +%T)) ==="
python3 scripts/gpu/nvml_idle.py 30 2>&1 | tee "$OUT/nvml_idle.txt"

echo "=== ingest benchmark ($(date +%T)) ==="
T=$(mktemp -d)
if [ -f "$BIN/allocstats.test.gz" ]; then gunzip -c "$BIN/allocstats.test.gz" >"$T/allocstats.test"; else cp "$BIN/allocstats.test" "$T/"; fi
chmod +x "$T/allocstats.test"
(cd allocstats && "$T/allocstats.test" -test.run '^$' -test.bench IngestEndToEnd -test.benchtime 3s -test.cpu 1,2,4 2>&1) | tee "$OUT/ingest_bench.txt"
rm -rf "$T"
