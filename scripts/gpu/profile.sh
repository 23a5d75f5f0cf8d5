#!/usr/bin/env bash
# Where gpumem_exporter's CPU and memory go on a GPU machine. The exporter
# built with -tags pprof serves Go's profiles (pprof_build.go); with one
# and then N (default 16) PyTorch processes holding memory and reporting
# to it, this takes
#   at rest: each thread's CPU over 20 s (schedstat), the stats messages
#     received meanwhile, a CPU profile over PROFILE_SECONDS (Go frames
#     only) and, where perf is found, perf record -g over the same time
#     (native frames too: NVML, libcuda, the runtime), folded by
#     `measure.py perf-fold`; a 10 s execution trace; RSS by mapping (smaps);
#   under load: a CPU profile during 3000 kept-alive gzip scrapes, and the
#     scrapes' own figures (scripts/measure.py);
# then a CPU profile of BenchmarkRealPoll. Writes everything to $OUT; read
# the profiles with `go tool pprof -top FILE`, the traces with `go tool
# trace FILE`. Binaries in $BIN (default .bin, gzipped or not):
# gpumem_exporter_pprof and nvmlpoll.test, from scripts/gpu/build.sh. perf
# comes from PATH or PERF_BUNDLE (scripts/lib.sh). From the repository root:
#   OUT=/tmp/gpumem-profile bash scripts/gpu/profile.sh
set -u
. scripts/lib.sh
OUT=${OUT:-/tmp/gpumem-profile}
BIN=${BIN:-.bin}
N=${N:-16}
PROFILE_SECONDS=${PROFILE_SECONDS:-60}
mkdir -p "$OUT" /run/gpumem
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	rm -rf "$WORK"
}
trap cleanup EXIT
unpack "$BIN/gpumem_exporter_pprof" "$WORK/gpumem_exporter_pprof" || exit 1
unpack "$BIN/nvmlpoll.test" "$WORK/nvmlpoll.test" || exit 1
PERF=$(tool perf)
{
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	host_line
	[ -n "$PERF" ] && echo "perf: $PERF" || echo "no perf here (PATH or PERF_BUNDLE): Go profiles only"
} | tee "$OUT/summary.txt"

URL=http://127.0.0.1:9481
"$WORK/gpumem_exporter_pprof" --web.listen-address=127.0.0.1:9481 --nvml.poll-interval=1s \
	--allocstats.socket=/run/gpumem/allocstats.sock >"$OUT/exporter.log" 2>&1 &
EXP=$!
PIDS+=("$EXP")
get() { python3 -c "import urllib.request as u, sys; sys.stdout.buffer.write(u.urlopen(sys.argv[1], timeout=120).read())" "$1"; }
for _ in $(seq 100); do get $URL/-/ready >/dev/null 2>&1 && break; sleep 0.2; done
metric() { get $URL/metrics | python3 -c "import sys; print(sum(float(l.split()[-1]) for l in sys.stdin if l.startswith(sys.argv[1])))" "$1"; }
smaps() {
	python3 - "$1" <<'PY'
import collections, sys
rss, anon, name = collections.Counter(), collections.Counter(), None
for line in open("/proc/%s/smaps" % sys.argv[1]):
    f = line.split()
    if "-" in f[0] and len(f) >= 5 and not f[0].endswith(":"):
        name = f[5] if len(f) > 5 else "[anon]"
    elif f[0] == "Rss:":
        rss[name] += int(f[1])
    elif f[0] == "Anonymous:":
        anon[name] += int(f[1])
for n, kb in rss.most_common(15):
    print("%8.1f MiB rss %8.1f MiB anon  %s" % (kb / 1024, anon[n] / 1024, n))
print("total %.1f MiB, anon %.1f MiB" % (sum(rss.values()) / 1024, sum(anon.values()) / 1024))
PY
}
for n in 1 "$N"; do
	have=$(gpu_processes)
	for _ in $(seq $((n - have))); do
		python3 scripts/gpu/workloads.py hold 256 >/dev/null 2>&1 &
		PIDS+=("$!")
	done
	wait_gpu_processes "$n"
	for _ in $(seq 120); do
		[ "$(metric 'gpumem_allocstats_connections ' | cut -d. -f1)" -ge "$n" ] 2>/dev/null && break
		sleep 1
	done
	sleep 5
	echo "== $n processes" | tee -a "$OUT/summary.txt"
	m0=$(metric 'gpumem_allocstats_messages_total{')
	t0=$(python3 -c "import glob; print(' '.join('%s:%s' % (p.split('/')[4], open(p).read().split()[0]) for p in glob.glob('/proc/$EXP/task/*/schedstat')))")
	sleep 20
	python3 - "$EXP" "$t0" <<'PY' | tee -a "$OUT/summary.txt"
import glob, sys
before = dict(x.split(":") for x in sys.argv[2].split())
for p in sorted(glob.glob("/proc/%s/task/*/schedstat" % sys.argv[1])):
    tid = p.split("/")[4]
    ns = int(open(p).read().split()[0]) - int(before.get(tid, 0))
    comm = open("/proc/%s/task/%s/comm" % (sys.argv[1], tid)).read().strip()
    if ns > 0:
        print("thread %s (%s): %.3f ms of CPU in 20 s at rest" % (tid, comm, ns / 1e6))
PY
	m1=$(metric 'gpumem_allocstats_messages_total{')
	echo "messages in 20 s at rest: $(python3 -c "print(int($m1 - $m0))")" | tee -a "$OUT/summary.txt"
	if [ -n "$PERF" ]; then
		# shellcheck disable=SC2086 # PERF may be a loader command line
		$PERF record -F 1999 -g -p "$EXP" -o "$WORK/perf.data" -- sleep "$PROFILE_SECONDS" >"$WORK/perf_record.txt" 2>&1 &
		perf_pid=$!
	fi
	get "$URL/debug/pprof/profile?seconds=$PROFILE_SECONDS" >"$OUT/idle_$n.prof"
	if [ -n "$PERF" ]; then
		wait "$perf_pid"
		echo "-- perf, at rest, by what the stacks were doing" | tee -a "$OUT/summary.txt"
		# shellcheck disable=SC2086
		$PERF script -F comm,tid,ip,sym,dso -i "$WORK/perf.data" 2>/dev/null |
			python3 scripts/measure.py perf-fold --folded "$OUT/folded_idle_$n.txt" | tee -a "$OUT/summary.txt"
	fi
	get "$URL/debug/pprof/trace?seconds=10" >"$OUT/idle_$n.trace"
	smaps "$EXP" | tee -a "$OUT/summary.txt"
	get "$URL/debug/pprof/profile?seconds=15" >"$OUT/scrapes_$n.prof" &
	prof=$!
	sleep 0.5
	python3 scripts/measure.py scrapes "$URL/metrics" "$EXP" 3000 gzip-keepalive | tee -a "$OUT/summary.txt"
	wait $prof
done
GPUMEM_REAL_NVML=1 "$WORK/nvmlpoll.test" -test.run='^$' -test.bench='^BenchmarkReal(Poll|DataCalls)$' \
	-test.benchtime=3000x -test.count=3 -test.cpuprofile="$OUT/poll.prof" 2>&1 | grep -E '^Benchmark' | tee -a "$OUT/summary.txt"
