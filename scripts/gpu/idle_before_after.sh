#!/usr/bin/env bash
# Idle CPU and RSS of two gpumem_exporter builds side by side on one GPU
# (issue 12: idle CPU <= 0.05% of a core per GPU at a 1 s poll, clients
# pushing at 1 Hz): BEFORE and AFTER each poll NVML every second, each with
# its own N PyTorch processes (hold.py) reporting to its own socket, N = 1
# then 16. For each: CPU over 60 s without scrapes (both at once, so both
# see the same machine) and RSS. Then NVML's own memory by init flags
# (nvml_init_flags.py) and the ingest benchmark of AFTER's allocstats test
# binary. Binaries in $BIN (gzipped or not): $BEFORE, $AFTER,
# $AFTER_ALLOCSTATS. VARIANTS runs more than two side by side instead:
# "name=binary[,flag...] ..." (AFTER_ALLOCSTATS="" skips the benchmark).
# From the repository root:
#   OUT=/tmp/idle bash scripts/gpu/idle_before_after.sh
#   VARIANTS="old=gpumem_exporter_new lists0=gpumem_exporter_head,--nvml.process-refresh=0s head=gpumem_exporter_head" \
#     AFTER_ALLOCSTATS= OUT=/tmp/idle bash scripts/gpu/idle_before_after.sh
set -u
. scripts/gpu/lib.sh
OUT=${OUT:-/tmp/gpumem-idle}
BIN=${BIN:-.bin/compare}
BEFORE=${BEFORE:-gpumem_exporter}
AFTER=${AFTER:-gpumem_exporter_new}
AFTER_ALLOCSTATS=${AFTER_ALLOCSTATS-allocstats_new.test}
IDLE_SECONDS=${IDLE_SECONDS:-60}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
unpack() {
	if [ -f "$BIN/$1.gz" ]; then gunzip -c "$BIN/$1.gz" >"$WORK/$1"; else cp "$BIN/$1" "$WORK/$1"; fi
	chmod +x "$WORK/$1"
}
VARIANTS=${VARIANTS:-before=$BEFORE after=$AFTER}
declare -A BINOF FLAGSOF
NAMES=()
for v in $VARIANTS; do
	name=${v%%=*} rest=${v#*=}
	NAMES+=("$name")
	BINOF[$name]=${rest%%,*}
	FLAGSOF[$name]=$([ "$rest" != "${rest#*,}" ] && echo "${rest#*,}" | tr , ' ')
	[ -f "$WORK/${BINOF[$name]}" ] || unpack "${BINOF[$name]}"
done
[ -z "$AFTER_ALLOCSTATS" ] || unpack "$AFTER_ALLOCSTATS"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/environment.txt"
echo "cpus $(nproc) kernel $(uname -r)" | tee -a "$OUT/environment.txt"

declare -A EXP SOCK PORT
port=9600
for b in "${NAMES[@]}"; do
	SOCK[$b]=$WORK/$b.sock
	PORT[$b]=$port
	# shellcheck disable=SC2086 # the flags are words
	"$WORK/${BINOF[$b]}" --web.listen-address=127.0.0.1:$port --nvml.poll-interval=1s \
		--allocstats.socket="${SOCK[$b]}" ${FLAGSOF[$b]} >"$OUT/exporter_$b.log" 2>&1 &
	EXP[$b]=$!
	PIDS+=("$!")
	port=$((port + 1))
done
sleep 2
: >"$OUT/idle.jsonl"
have=0
for n in 1 16; do
	for b in "${NAMES[@]}"; do
		for _ in $(seq $((n - have))); do
			GPUMEM_SOCKET=${SOCK[$b]} python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 &
			PIDS+=("$!")
		done
	done
	have=$n
	wait_gpu_processes $((${#NAMES[@]} * n))
	sleep 8
	m=()
	for b in "${NAMES[@]}"; do
		curl -s 127.0.0.1:${PORT[$b]}/metrics | grep -E '^gpumem_nvml_poll_duration_seconds_(sum|count) ' | awk '{print $2}' | paste -sd ' ' >"$WORK/poll0_$b"
		python3 scripts/gpu/peer_bench.py idle "${EXP[$b]}" "$IDLE_SECONDS" >"$WORK/idle_$b" &
		m+=("$!")
	done
	wait "${m[@]}"
	for b in "${NAMES[@]}"; do
		# The mean poll over the idle window, from the exporter's own histogram.
		curl -s 127.0.0.1:${PORT[$b]}/metrics | grep -E '^gpumem_nvml_poll_duration_seconds_(sum|count) ' | awk '{print $2}' | paste -sd ' ' |
			awk -v b="$b" -v n="$n" -v f="$WORK/poll0_$b" 'BEGIN { getline l < f; split(l, a, " ") } { printf "%s n=%d: mean poll %.1f us over %d polls\n", b, n, ($1 - a[1]) / ($2 - a[2]) * 1e6, $2 - a[2] }' | tee -a "$OUT/polls.txt"
		rss=$(grep -E '^(VmRSS|RssAnon|RssFile):' /proc/${EXP[$b]}/status | awk '{printf "%s%.1f", (NR>1?",":""), $2/1024}')
		python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.update(build=sys.argv[2], processes=int(sys.argv[3]), rss_anon_file_mib=sys.argv[4]); print(json.dumps(d))" \
			"$WORK/idle_$b" "$b" "$n" "$rss" | tee -a "$OUT/idle.jsonl"
	done
	for b in "${NAMES[@]}"; do
		curl -s 127.0.0.1:${PORT[$b]}/metrics | grep -E '^gpumem_allocstats_(messages_total\{result="ok",type="stats"|connections )' | sed "s/^/$b n=$n: /"
	done | tee -a "$OUT/messages.txt"
done
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
PIDS=()

echo "=== NVML memory by init flags ==="
for f in 0 2; do python3 scripts/gpu/nvml_init_flags.py $f; done 2>&1 | tee "$OUT/nvml_init_flags.txt"

[ -n "$AFTER_ALLOCSTATS" ] || exit 0
echo "=== ingest benchmark (after) ==="
(cd allocstats && "$WORK/$AFTER_ALLOCSTATS" -test.run '^$' -test.bench IngestEndToEnd -test.benchtime 3s -test.cpu 1,2 2>&1) | tee "$OUT/ingest_bench.txt"
