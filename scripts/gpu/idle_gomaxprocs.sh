#!/usr/bin/env bash
# CPU of gpumem_exporter at rest and per scrape by --runtime.gomaxprocs:
# three exporters at once (1, 2 and 0 = one thread per CPU), each polling
# NVML every second, with one and then sixteen PyTorch processes holding
# memory on GPU 0 (reporting to the first exporter's socket). For each:
# CPU over 30 s at rest, then 300 kept-alive gzip scrapes. Writes
# $OUT/gomaxprocs.jsonl. Binary: $BIN/gpumem_exporter(.gz), as for
# compare_peers.sh.
set -u
. scripts/gpu/lib.sh
OUT=${OUT:-/tmp/gpumem-gomaxprocs}
BIN=${BIN:-.bin/compare}
mkdir -p "$OUT" /run/gpumem
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
if [ -f "$BIN/gpumem_exporter.gz" ]; then gunzip -c "$BIN/gpumem_exporter.gz" >"$WORK/e"; else cp "$BIN/gpumem_exporter" "$WORK/e"; fi
chmod +x "$WORK/e"
declare -A EXP
for g in 1 2 0; do
	sock=/run/gpumem/allocstats.sock
	[ "$g" = 1 ] || sock=$WORK/sock$g
	"$WORK/e" --web.listen-address=127.0.0.1:$((9490 + g)) --nvml.poll-interval=1s --runtime.gomaxprocs=$g \
		--allocstats.socket="$sock" >"$OUT/exporter_gomaxprocs$g.log" 2>&1 &
	EXP[$g]=$!
	PIDS+=("$!")
done
sleep 2
: >"$OUT/gomaxprocs.jsonl"
for n in 1 16; do
	have=$(gpu_processes)
	for _ in $(seq $((n - have))); do
		python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 &
		PIDS+=("$!")
	done
	wait_gpu_processes "$n" 120
	sleep 5
	idle=()
	for g in 1 2 0; do
		python3 scripts/gpu/peer_bench.py idle "${EXP[$g]}" 30 >"$WORK/idle$g" &
		idle+=("$!")
	done
	wait "${idle[@]}"
	for g in 1 2 0; do
		python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.update(gomaxprocs=int(sys.argv[2]), processes=int(sys.argv[3]), what='idle'); print(json.dumps(d))" \
			"$WORK/idle$g" "$g" "$n" | tee -a "$OUT/gomaxprocs.jsonl"
	done
	for g in 1 2 0; do
		python3 scripts/gpu/peer_bench.py scrapes "http://127.0.0.1:$((9490 + g))/metrics" "${EXP[$g]}" 300 gzip-keepalive |
			python3 -c "import json,sys; d=json.load(sys.stdin); d.update(gomaxprocs=int(sys.argv[1]), processes=int(sys.argv[2]), what='scrapes'); print(json.dumps(d))" "$g" "$n" |
			tee -a "$OUT/gomaxprocs.jsonl"
	done
done
