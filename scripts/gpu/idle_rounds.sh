#!/usr/bin/env bash
# Idle CPU of gpumem_exporter builds with exactly N PyTorch processes on
# the GPU, all reporting (issue 12: idle CPU <= 0.05% of a core per GPU at
# a 1 s poll), in one device call. The N processes (hold.py) start once
# and report to one socket path; each round starts one build on that path
# (the clients reconnect), waits until all N are connected, measures its
# CPU over IDLE_SECONDS without scrapes (schedstat), its mean poll and
# RSS, then counts its system calls for STRACE_SECONDS (strace -f -c, the
# first two rounds only; STRACE_SECONDS=0 skips it), then, with SCRAPES=N,
# N sequential scrapes in each of SCRAPE_MODES (peer_bench.py's: plain,
# gzip, keepalive, gzip-keepalive) into scrapes.jsonl, and stops it. Rounds alternate the builds, so
# each is measured more than once on the same host:
#   ROUNDS="new old new old" VARIANTS="new=new old=old" BIN=.bin/idle2 \
#     OUT=/tmp/rounds bash scripts/gpu/idle_rounds.sh
# VARIANTS maps a round's name to a binary in $BIN (gzipped or not) and
# its flags: "name=binary[,flag...] ..."; a word NAME=value among the
# flags goes into the build's environment instead. strace comes from $PERF_BUNDLE
# as in idle_perf.sh. CLIENT is the directory of the gpumem package the
# processes use (default clients/python; another commit's copy, from git
# archive, compares clients). Back in $OUT: summary.txt, rounds.jsonl
# (and scrapes.jsonl).
set -u
. scripts/gpu/lib.sh
OUT=${OUT:-/tmp/gpumem-idle-rounds}
BIN=${BIN:-.bin/idle2}
VARIANTS=${VARIANTS:-new=new old=old}
ROUNDS=${ROUNDS:-new old new old}
N=${N:-16}
IDLE_SECONDS=${IDLE_SECONDS:-60}
STRACE_SECONDS=${STRACE_SECONDS:-20}
SCRAPES=${SCRAPES:-0}
SCRAPE_MODES=${SCRAPE_MODES:-plain gzip gzip-keepalive}
# SCRAPE_PATHS="/metrics /-/healthy" also times the health check, a
# handler that writes a few bytes: the client's, the connection's and Go's
# HTTP server's share of a scrape on this host.
SCRAPE_PATHS=${SCRAPE_PATHS:-/metrics}
PERF_BUNDLE=${PERF_BUNDLE:-.bin/perf.tgz}
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.txt") 2>&1
CLIENT=${CLIENT:-$PWD/clients/python}
export PYTHONUNBUFFERED=1 PYTHONPATH=$CLIENT
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	# never a bare wait: it would wait for the tee of the output too
	[ ${#PIDS[@]} -eq 0 ] || wait "${PIDS[@]}" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
declare -A BINOF FLAGSOF
for v in $VARIANTS; do
	name=${v%%=*} rest=${v#*=}
	BINOF[$name]=${rest%%,*}
	FLAGSOF[$name]=$([ "$rest" != "${rest#*,}" ] && echo "${rest#*,}" | tr , ' ')
	b=${BINOF[$name]}
	if [ -f "$BIN/$b.gz" ]; then gunzip -c "$BIN/$b.gz" >"$WORK/$b"; else cp "$BIN/$b" "$WORK/$b"; fi ||
		{ echo "missing $BIN/$b (or $b.gz): build it first; on the device tool, carry $BIN" >&2; exit 1; }
	chmod +x "$WORK/$b"
done
# Written back to disk before any round: a binary's dirty pages would
# stay in memory whatever the exporter asks of the kernel.
sync
STRACE=
if [ -f "$PERF_BUNDLE" ]; then
	tar -C "$WORK" -xzf "$PERF_BUNDLE"
	STRACE="$WORK/perf/lib/ld-linux-x86-64.so.2 --library-path $WORK/perf/lib $WORK/perf/strace"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
host_line

SOCK=$WORK/s.sock
metric() { curl -s 127.0.0.1:9600/metrics | grep -E "^$1 " | awk '{print $2}'; }
start() {
	local envs=() flags=()
	for w in ${FLAGSOF[$1]}; do
		case $w in [A-Z_]*=*) envs+=("$w") ;; *) flags+=("$w") ;; esac
	done
	env "${envs[@]}" "$WORK/${BINOF[$1]}" --web.listen-address=127.0.0.1:9600 --nvml.poll-interval=1s \
		--allocstats.socket="$SOCK" "${flags[@]}" >"$WORK/exporter_$1.log" 2>&1 &
	E=$!
	for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
}
stop() {
	kill "$E"
	wait "$E" 2>/dev/null
}

first=${ROUNDS%% *}
start "$first"
started=1
for _ in $(seq "$N"); do
	GPUMEM_SOCKET=$SOCK python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 &
	PIDS+=("$!")
done
wait_gpu_processes "$N"
echo "$(gpu_processes) processes on the GPU"
round=0
for v in $ROUNDS; do
	round=$((round + 1))
	[ "$started" = 1 ] || start "$v"
	started=0
	for _ in $(seq 60); do
		[ "$(metric gpumem_allocstats_connections)" = "$N" ] && break
		sleep 1
	done
	sleep 10
	c0=$(metric gpumem_allocstats_connections)
	p0=$(curl -s 127.0.0.1:9600/metrics | grep -E '^gpumem_nvml_poll_duration_seconds_(sum|count) ' | awk '{print $2}' | paste -sd ' ')
	m0=$(metric 'gpumem_allocstats_messages_total\{result="ok",type="stats"\}')
	python3 scripts/gpu/peer_bench.py idle "$E" "$IDLE_SECONDS" >"$WORK/idle.json"
	p1=$(curl -s 127.0.0.1:9600/metrics | grep -E '^gpumem_nvml_poll_duration_seconds_(sum|count) ' | awk '{print $2}' | paste -sd ' ')
	m1=$(metric 'gpumem_allocstats_messages_total\{result="ok",type="stats"\}')
	poll=$(echo "$p0 $p1" | awk '{ printf "%.1f", ($3 - $1) / ($4 - $2) * 1e6 }')
	rss=$(grep -E '^(VmRSS|RssAnon|RssFile):' /proc/$E/status | awk '{printf "%s%.1f", (NR>1?",":""), $2/1024}')
	python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.update(round=int(sys.argv[2]), build=sys.argv[3], connections=sys.argv[4], stats_lines=int(sys.argv[5]), mean_poll_us=float(sys.argv[6]), rss_anon_file_mib=sys.argv[7]); print(json.dumps(d))" \
		"$WORK/idle.json" "$round" "$v" "$c0" "$((m1 - m0))" "$poll" "$rss" | tee -a "$OUT/rounds.jsonl"
	echo "-- $v: largest mappings (resident KiB, range, permissions, name)"
	awk '/^[0-9a-f]+-[0-9a-f]+ /{m=$1" "$2" "($6==""?"[anon]":$6)} /^Rss:/{print $2, m}' /proc/$E/smaps | sort -rn | head -12
	if [ "$SCRAPES" -gt 0 ]; then
		for path in $SCRAPE_PATHS; do
			for what in $SCRAPE_MODES; do
				python3 scripts/gpu/peer_bench.py scrapes "http://127.0.0.1:9600$path" "$E" "$SCRAPES" "$what" |
					python3 -c "import json,sys; d=json.load(sys.stdin); d.update(round=int(sys.argv[1]), build=sys.argv[2], what=sys.argv[3], path=sys.argv[4]); print(json.dumps(d))" \
						"$round" "$v" "$what" "$path" | tee -a "$OUT/scrapes.jsonl"
			done
		done
	fi
	if [ -n "$STRACE" ] && [ "$round" -le 2 ] && [ "$STRACE_SECONDS" -gt 0 ]; then
		timeout -s INT "$STRACE_SECONDS" $STRACE -f -c -p "$E" -o "$WORK/strace.txt" >/dev/null 2>&1
		echo "-- $v: system calls over $STRACE_SECONDS s"
		head -20 "$WORK/strace.txt"
	fi
	stop
done
