#!/usr/bin/env bash
# What gpumem_exporter costs at rest (and, optionally, per scrape), for one
# or more builds measured in alternating rounds on one machine. N
# processes report allocator stats to one socket path throughout: on a GPU
# (BACKEND=nvml), PyTorch processes each holding 256 MiB
# (`scripts/gpu/workloads.py hold`); without one (BACKEND=simulated),
# stand-in clients (`scripts/measure.py clients`) beside the simulated node. Each round starts
# one build on that path (the clients reconnect), waits until all N are
# connected, then measures
#   - CPU over IDLE_SECONDS without scrapes (schedstat of every thread),
#     the mean poll (the exporter's own histogram), the stats lines
#     received, RSS (VmRSS, RssAnon, RssFile) and the largest mappings;
#   - with STRACE_SECONDS > 0, system calls by kind (strace -f -c);
#   - with SCRAPES > 0, that many sequential scrapes in each of
#     SCRAPE_MODES (scripts/measure.py's modes) of each of SCRAPE_PATHS;
# and stops the build. On a GPU it ends with NVML's own floor: the data
# calls of one poll, once a second, from Python (`scripts/gpu/nvml.py idle`).
#
#   EXPORTER=./gpumem_exporter bash scripts/idle.sh
#   VARIANTS="new=/tmp/new old=/tmp/old" ROUNDS="new old new old" bash scripts/idle.sh
#   VARIANTS="one=./gpumem_exporter all=./gpumem_exporter,--runtime.gomaxprocs=0" \
#     ROUNDS="one all one all" bash scripts/idle.sh
#   BACKEND=simulated SCRAPES=300 IDLE_SECONDS=10 EXPORTER=./gpumem_exporter bash scripts/idle.sh
#
# VARIANTS: "name=binary[,word...] ...": a word NAME=value goes into that
# build's environment (GOGC=200), any other is a flag. A binary may be
# gzipped (binary.gz). ROUNDS: the variants' names in the order to run
# (default: each variant twice, alternated). CLIENT: the directory of the
# gpumem package the clients use (default clients/python; a `git archive`
# copy of another commit's measures another client). PERF_BUNDLE: where
# strace comes from on a machine without it (scripts/lib.sh). Back in
# $OUT: summary.txt, rounds.jsonl, scrapes.jsonl.
set -u
. scripts/lib.sh
BACKEND=${BACKEND:-nvml}
EXPORTER=${EXPORTER:-./gpumem_exporter}
VARIANTS=${VARIANTS:-build=$EXPORTER}
N=${N:-16}
IDLE_SECONDS=${IDLE_SECONDS:-60}
STRACE_SECONDS=${STRACE_SECONDS:-0}
SCRAPES=${SCRAPES:-0}
SCRAPE_MODES=${SCRAPE_MODES:-plain gzip keepalive gzip-keepalive}
# "/metrics /-/healthy" also times the health check, a handler that
# writes a few bytes: the client's, the connection's and Go's HTTP
# server's share of a scrape.
SCRAPE_PATHS=${SCRAPE_PATHS:-/metrics}
# The simulated node near an H200 node's series count: 8 GPUs, 2
# processes each.
SIM_FLAGS=${SIM_FLAGS:---nvml.backend=simulated --nvml.simulated.scenario=load --nvml.simulated.processes-per-gpu=2}
SIM_UUID=GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000000 # the simulated node's GPU 0
PORT=${PORT:-9600}
OUT=${OUT:-/tmp/gpumem-idle}
CLIENT=${CLIENT:-$PWD/clients/python}
case $BACKEND in nvml | simulated) ;; *) echo "scripts/idle.sh: BACKEND is nvml or simulated, not $BACKEND" >&2; exit 2 ;; esac
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.txt") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$CLIENT
WORK=$(mktemp -d)
PIDS=()
E=
cleanup() {
	for p in "${PIDS[@]}" $E; do kill "$p" 2>/dev/null; done
	# never a bare wait: it would wait for the tee of the output too
	for p in "${PIDS[@]}" $E; do wait "$p" 2>/dev/null; done
	rm -rf "$WORK"
}
trap cleanup EXIT

declare -A BINOF WORDSOF
NAMES=()
for v in $VARIANTS; do
	name=${v%%=*} rest=${v#*=}
	NAMES+=("$name")
	BINOF[$name]=$WORK/bin_$name
	WORDSOF[$name]=$([ "$rest" != "${rest#*,}" ] && echo "${rest#*,}" | tr , ' ')
	unpack "${rest%%,*}" "${BINOF[$name]}" || exit 1
done
ROUNDS=${ROUNDS:-${NAMES[*]} ${NAMES[*]}}
STRACE=
[ "$STRACE_SECONDS" -le 0 ] || STRACE=$(tool strace)
[ "$STRACE_SECONDS" -le 0 ] || [ -n "$STRACE" ] || echo "no strace here (PATH or PERF_BUNDLE): system calls not counted"
[ "$BACKEND" = simulated ] || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
host_line
echo "backend $BACKEND, $N reporting processes, variants: $VARIANTS"

SOCK=$WORK/s.sock
metrics() { curl -s "127.0.0.1:$PORT/metrics"; }
metric() { metrics | awk -v m="$1" '$1 == m {print $2}'; }
poll_sum_count() { metrics | awk '$1 == "gpumem_nvml_poll_duration_seconds_sum" {s = $2} $1 == "gpumem_nvml_poll_duration_seconds_count" {c = $2} END {print s, c}'; }
start() {
	local envs=() flags=()
	for w in ${WORDSOF[$1]}; do
		case $w in [A-Z_]*=*) envs+=("$w") ;; *) flags+=("$w") ;; esac
	done
	# shellcheck disable=SC2086 # SIM_FLAGS is a list of flags
	env "${envs[@]}" "${BINOF[$1]}" --web.listen-address="127.0.0.1:$PORT" --nvml.poll-interval=1s \
		--allocstats.socket="$SOCK" $([ "$BACKEND" = simulated ] && echo $SIM_FLAGS) "${flags[@]}" >"$WORK/exporter_$1.log" 2>&1 &
	E=$!
	for _ in $(seq 100); do curl -sf "127.0.0.1:$PORT/-/ready" >/dev/null && break; sleep 0.1; done
}
stop() {
	kill "$E"
	wait "$E" 2>/dev/null
	E=
}

read -r first _ <<<"$ROUNDS"
start "$first"
if [ "$BACKEND" = simulated ]; then
	python3 scripts/measure.py clients "$N" "$SOCK" "$CLIENT" "$SIM_UUID" &
	PIDS+=("$!")
else
	for _ in $(seq "$N"); do
		GPUMEM_SOCKET=$SOCK python3 scripts/gpu/workloads.py hold 256 >/dev/null 2>&1 &
		PIDS+=("$!")
	done
	wait_gpu_processes "$N"
	echo "$(gpu_processes) processes on the GPU"
fi
: >"$OUT/rounds.jsonl"
: >"$OUT/scrapes.jsonl"
round=0
for v in $ROUNDS; do
	round=$((round + 1))
	[ -n "$E" ] || start "$v"
	for _ in $(seq 120); do
		[ "$(metric gpumem_allocstats_connections)" = "$N" ] && break
		sleep 1
	done
	sleep 10
	conns=$(metric gpumem_allocstats_connections)
	p0=$(poll_sum_count)
	m0=$(metric 'gpumem_allocstats_messages_total{result="ok",type="stats"}')
	python3 scripts/measure.py idle "$E" "$IDLE_SECONDS" >"$WORK/idle.json"
	p1=$(poll_sum_count)
	m1=$(metric 'gpumem_allocstats_messages_total{result="ok",type="stats"}')
	poll=$(echo "$p0 $p1" | awk '$4 > $2 { printf "%.1f", ($3 - $1) / ($4 - $2) * 1e6; next } { print 0 }')
	rss=$(awk '/^(VmRSS|RssAnon|RssFile):/ {printf "%s%.1f", (n++ ? "," : ""), $2 / 1024}' "/proc/$E/status")
	python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.update(round=int(sys.argv[2]), build=sys.argv[3], connections=sys.argv[4], stats_lines=int(float(sys.argv[5])), mean_poll_us=float(sys.argv[6]), rss_anon_file_mib=sys.argv[7]); print(json.dumps(d))" \
		"$WORK/idle.json" "$round" "$v" "$conns" "$(awk -v a="${m0:-0}" -v b="${m1:-0}" 'BEGIN {print b - a}')" "$poll" "$rss" | tee -a "$OUT/rounds.jsonl"
	echo "-- $v: largest mappings (resident KiB, range, permissions, name)"
	awk '/^[0-9a-f]+-[0-9a-f]+ / {m = $1 " " $2 " " ($6 == "" ? "[anon]" : $6)} /^Rss:/ {print $2, m}' "/proc/$E/smaps" | sort -rn | head -8
	if [ -n "$STRACE" ]; then
		# shellcheck disable=SC2086 # STRACE may be a loader command line
		timeout -s INT "$STRACE_SECONDS" $STRACE -f -c -p "$E" -o "$WORK/strace.txt" >/dev/null 2>&1
		echo "-- $v: system calls over $STRACE_SECONDS s"
		head -20 "$WORK/strace.txt"
	fi
	if [ "$SCRAPES" -gt 0 ]; then
		for path in $SCRAPE_PATHS; do
			for what in $SCRAPE_MODES; do
				python3 scripts/measure.py scrapes "http://127.0.0.1:$PORT$path" "$E" "$SCRAPES" "$what" |
					python3 -c "import json,sys; d=json.load(sys.stdin); d.update(round=int(sys.argv[1]), build=sys.argv[2], what=sys.argv[3], path=sys.argv[4]); print(json.dumps(d))" \
						"$round" "$v" "$what" "$path" | tee -a "$OUT/scrapes.jsonl"
			done
		done
	fi
	stop
done
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
PIDS=()
if [ "$BACKEND" = nvml ]; then
	echo "-- NVML's floor: one poll's data calls once a second from Python, nothing else running"
	python3 scripts/gpu/nvml.py idle 30
fi
