#!/usr/bin/env bash
# Where gpumem_exporter's CPU and memory go on a GPU machine: a build with
# -tags pprof serves Go's profiles; with one and then sixteen PyTorch
# processes holding memory and reporting, this takes a 20 s execution trace at
# rest (with each thread's CPU) and one during 3000 kept-alive gzip scrapes, the allocator stats
# messages received per second at rest, the exporter's RSS by mapping
# (smaps), and a CPU profile of BenchmarkRealPoll. Writes everything to
# $OUT; read the profiles here with `go tool pprof -top FILE`.
# Build (on a machine with Go; see docs/benchmarks.md):
#   CGO_ENABLED=1 go build -tags pprof -trimpath -o /tmp/gpumem_exporter_pprof .
#   gzip -9 -c /tmp/gpumem_exporter_pprof >.bin/compare/gpumem_exporter_pprof.gz
set -u
OUT=${OUT:-/tmp/gpumem-profile}
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
for b in gpumem_exporter_pprof nvmlpoll.test; do
	gunzip -c "$BIN/$b.gz" >"$WORK/$b" && chmod +x "$WORK/$b" || exit 1
done
URL=http://127.0.0.1:9481
"$WORK/gpumem_exporter_pprof" --web.listen-address=127.0.0.1:9481 --nvml.poll-interval=1s \
	--allocstats.socket=/run/gpumem/allocstats.sock >"$OUT/exporter.log" 2>&1 &
EXP=$!
PIDS+=("$EXP")
get() { python3 -c "import urllib.request as u, sys; sys.stdout.buffer.write(u.urlopen(sys.argv[1], timeout=60).read())" "$1"; }
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
for n in 1 16; do
	have=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)
	for _ in $(seq $((n - have))); do
		python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 &
		PIDS+=("$!")
	done
	for _ in $(seq 120); do
		[ "$(metric 'gpumem_allocator_reserved_bytes{' | cut -d. -f1)" -ge $((n * 256 * 1048576)) ] 2>/dev/null && break
		sleep 1
	done
	sleep 5
	echo "== $n processes" | tee -a "$OUT/summary.txt"
	m0=$(metric 'gpumem_allocstats_messages_total{'); c0=$(metric 'gpumem_allocstats_connections ')
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
        print("thread %s (%s): %.3f ms of CPU in the 20 s at rest" % (tid, comm, ns / 1e6))
PY
	get "$URL/debug/pprof/trace?seconds=10" >"$OUT/idle_$n.trace"
	m1=$(metric 'gpumem_allocstats_messages_total{')
	echo "messages in the 30 s at rest: $(python3 -c "print(int($m1 - $m0))") (connections $c0)" | tee -a "$OUT/summary.txt"
	smaps "$EXP" | tee -a "$OUT/summary.txt"
	get "$URL/debug/pprof/profile?seconds=15" >"$OUT/scrapes_$n.prof" &
	prof=$!
	sleep 0.5
	python3 scripts/gpu/peer_bench.py scrapes "$URL/metrics" "$EXP" 3000 gzip-keepalive | tee -a "$OUT/summary.txt"
	wait $prof
done
GPUMEM_REAL_NVML=1 "$WORK/nvmlpoll.test" -test.run='^$' -test.bench='^BenchmarkReal(Poll|DataCalls)$' \
	-test.benchtime=3000x -test.count=3 -test.cpuprofile="$OUT/poll.prof" 2>&1 | grep -E '^Benchmark' | tee -a "$OUT/summary.txt"
command -v perf >/dev/null && echo "perf is installed" | tee -a "$OUT/summary.txt"
