#!/usr/bin/env bash
# Where an idle gpumem_exporter's CPU goes with 16 PyTorch processes on one
# GPU, and the ingest benchmark before and after, in one device call.
# 1. The exporter built with -tags pprof ($BIN/gpumem_exporter_pprof),
#    16 hold.py processes reporting to it: CPU over 60 s (peer_bench.py
#    idle) and a 60 s CPU profile at the same time ($OUT/cpu.pprof).
# 2. BenchmarkIngestEndToEnd of two allocstats test binaries ($BEFORE_TEST,
#    $AFTER_TEST), alternated three times, GOMAXPROCS 1.
#   OUT=/tmp/x bash scripts/gpu/issue12_idle_profile.sh
set -u
. scripts/gpu/lib.sh
OUT=${OUT:-/tmp/gpumem-idle-profile}
BIN=${BIN:-.bin/compare}
BEFORE_TEST=${BEFORE_TEST:-allocstats.test}
AFTER_TEST=${AFTER_TEST:-allocstats_new.test}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
W=$(mktemp -d)
for b in gpumem_exporter_pprof "$BEFORE_TEST" "$AFTER_TEST"; do
	gunzip -c "$BIN/$b.gz" >"$W/$b" && chmod +x "$W/$b"
done
"$W/gpumem_exporter_pprof" --web.listen-address=127.0.0.1:9700 --nvml.poll-interval=1s \
	--allocstats.socket="$W/s.sock" >"$OUT/exporter.log" 2>&1 &
E=$!
sleep 2
H=()
for _ in $(seq 16); do
	GPUMEM_SOCKET=$W/s.sock python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 &
	H+=("$!")
done
wait_gpu_processes 16
sleep 8
python3 scripts/gpu/peer_bench.py idle "$E" 60 >"$OUT/idle.json" &
I=$!
curl -s -o "$OUT/cpu.pprof" "127.0.0.1:9700/debug/pprof/profile?seconds=60"
wait "$I"
cat "$OUT/idle.json"
curl -s 127.0.0.1:9700/metrics | grep -E '^gpumem_allocstats_messages_total\{result="ok"' | tee "$OUT/messages.txt"
kill "$E" "${H[@]}"
wait 2>/dev/null
sleep 3
for round in 1 2 3; do
	for b in "$BEFORE_TEST" "$AFTER_TEST"; do
		echo "== $b round $round"
		(cd allocstats && "$W/$b" -test.run '^$' -test.bench 'IngestEndToEnd/peer=pidfd' -test.benchtime 2s -test.cpu 1 2>&1 | grep Benchmark)
	done
done | tee "$OUT/ingest_before_after.txt"
rm -rf "$W"
