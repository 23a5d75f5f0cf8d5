#!/usr/bin/env bash
# gpumem_exporter side by side with nvidia_gpu_exporter (NVML backend,
# per-process metrics on) on one GPU machine: one and then sixteen PyTorch
# processes holding memory and reporting allocator stats; for each exporter
# and size, CPU at rest (1 s poll, clients pushing at 1 Hz, no scrapes),
# then 100 sequential scrapes in each of four modes (a new connection each
# or one kept alive, without and with gzip: p50, p99, CPU per scrape,
# RSS); and the poll benchmarks on the real GPU. Writes $OUT/compare.md
# (the table), results.jsonl, nvml_bench.txt, the two exporters' logs and
# one body of each. Takes about 3 minutes; needs root, python3 with torch,
# and no network.
#
# Binaries in $BIN (default .bin, gzipped or not): gpumem_exporter,
# nvidia_gpu_exporter and nvmlpoll.test, from scripts/gpu/build.sh (with
# PEER_SRC for the peer). From the repository root:
#   OUT=/tmp/compare bash scripts/gpu/compare_peers.sh
# OURS_FLAGS adds flags to gpumem_exporter's command line (for instance
# --runtime.gomaxprocs=0 to compare with one thread per CPU).
set -u
. scripts/lib.sh
OUT=${OUT:-/tmp/gpumem-compare}
BIN=${BIN:-.bin}
mkdir -p "$OUT" /run/gpumem # the socket's directory: the exporter does not make a path given explicitly
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
OURS=http://127.0.0.1:9481/metrics
PEER=http://127.0.0.1:9835/metrics
RESULTS=$OUT/results.jsonl
: >"$RESULTS"
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
section() { echo; echo "=== $* ($(date +%T)) ==="; }

for b in gpumem_exporter nvidia_gpu_exporter nvmlpoll.test; do
	unpack "$BIN/$b" "$WORK/$b" || exit 1
done

section environment
{
	nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv
	python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
	host_line
	"$WORK/gpumem_exporter" --version 2>&1 | head -1
	echo "gpumem_exporter flags: ${OURS_FLAGS:-(defaults)}"
	"$WORK/nvidia_gpu_exporter" --version 2>&1 | head -1
} 2>&1 | tee "$OUT/environment.txt"

section exporters
# shellcheck disable=SC2086 # OURS_FLAGS is a list of flags
"$WORK/gpumem_exporter" --web.listen-address=127.0.0.1:9481 --nvml.poll-interval=1s \
	--allocstats.socket=/run/gpumem/allocstats.sock ${OURS_FLAGS:-} >"$OUT/gpumem_exporter.log" 2>&1 &
OURS_PID=$!
PIDS+=("$OURS_PID")
"$WORK/nvidia_gpu_exporter" --collect.backend=nvml --collect.compute-apps \
	--web.listen-address=127.0.0.1:9835 >"$OUT/nvidia_gpu_exporter.log" 2>&1 &
PEER_PID=$!
PIDS+=("$PEER_PID")
up() { python3 -c "import urllib.request as u, sys; u.urlopen(sys.argv[1], timeout=5)" "$1" 2>/dev/null; }
for _ in $(seq 100); do up http://127.0.0.1:9481/-/ready && up "$PEER" && break; sleep 0.2; done
up http://127.0.0.1:9481/-/ready || { echo "gpumem_exporter not ready"; tail -20 "$OUT/gpumem_exporter.log"; exit 1; }
up "$PEER" || { echo "nvidia_gpu_exporter not up"; tail -20 "$OUT/nvidia_gpu_exporter.log"; exit 1; }
echo "gpumem_exporter pid $OURS_PID, nvidia_gpu_exporter pid $PEER_PID"

# count URL PREFIX: series whose line starts with PREFIX.
count() {
	python3 -c "import urllib.request as u, sys; print(sum(1 for l in u.urlopen(sys.argv[1], timeout=10).read().decode().splitlines() if l.startswith(sys.argv[2])))" "$1" "$2"
}

# hold N MIB: start N processes that each hold MIB on GPU 0 and report.
hold() {
	for _ in $(seq "$1"); do
		python3 scripts/gpu/workloads.py hold "$2" >/dev/null 2>&1 &
		PIDS+=("$!")
	done
}

# measure PROCESSES: rest, scrapes and NVML benchmarks at this size.
measure() {
	local n=$1 benchtime=$2 want
	for _ in $(seq 120); do
		want=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)
		[ "$want" -ge "$n" ] && [ "$(count "$OURS" 'gpumem_allocator_reserved_bytes{')" -ge "$n" ] && break
		sleep 1
	done
	echo "processes on the GPU: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l);" \
		"reporting to gpumem_exporter: $(count "$OURS" 'gpumem_allocator_reserved_bytes{');" \
		"per-process series of nvidia_gpu_exporter: $(count "$PEER" 'nvidia_smi_compute_app_used_memory_bytes{')"
	sleep 3

	section "$n: at rest for 30 s (no scrapes)"
	python3 scripts/measure.py idle "$OURS_PID" 30 >"$WORK/idle_ours" &
	local a=$!
	python3 scripts/measure.py idle "$PEER_PID" 30 >"$WORK/idle_peer" &
	wait $a $!
	for e in ours peer; do
		name=gpumem_exporter; [ $e = peer ] && name=nvidia_gpu_exporter
		python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.update(exporter=sys.argv[2], processes=int(sys.argv[3]), what='idle'); print(json.dumps(d))" \
			"$WORK/idle_$e" "$name" "$n" | tee -a "$RESULTS"
	done

	section "$n: 100 sequential scrapes of each"
	for what in plain gzip keepalive gzip-keepalive; do
		for e in ours peer; do
			url=$OURS pid=$OURS_PID name=gpumem_exporter
			[ $e = peer ] && url=$PEER pid=$PEER_PID name=nvidia_gpu_exporter
			python3 scripts/measure.py scrapes "$url" "$pid" 100 $what |
				python3 -c "import json,sys; d=json.load(sys.stdin); d.update(exporter=sys.argv[1], processes=int(sys.argv[2]), what=sys.argv[3]); print(json.dumps(d))" \
					"$name" "$n" "$what" | tee -a "$RESULTS"
		done
	done

	section "$n: one poll against the NVML calls it makes"
	echo "# $n process(es) on the GPU" >>"$OUT/nvml_bench.txt"
	GPUMEM_REAL_NVML=1 "$WORK/nvmlpoll.test" -test.run='^$' -test.bench='^BenchmarkReal(Poll|DataCalls|RawCalls)$' \
		-test.benchtime="$benchtime" 2>&1 | grep -E '^Benchmark' | tee -a "$OUT/nvml_bench.txt"
}

: >"$OUT/nvml_bench.txt"
section "1 process"
hold 1 1024
measure 1 2000x

section "16 processes"
hold 15 256
measure 16 500x
python3 -c "import urllib.request as u; open('$OUT/metrics_gpumem_exporter_16.txt','wb').write(u.urlopen('$OURS').read())"
python3 -c "import urllib.request as u; open('$OUT/metrics_nvidia_gpu_exporter_16.txt','wb').write(u.urlopen('$PEER').read())"

section table
python3 scripts/measure.py table "$RESULTS" | tee "$OUT/compare.md"
{
	echo
	echo "One poll (BenchmarkRealPoll) against only the calls whose answers change (BenchmarkRealDataCalls:"
	echo "device count, memory info v2, compute and graphics process lists) and against every call a poll"
	echo "made before identity was cached (BenchmarkRealRawCalls):"
	echo
	echo '```'
	cat "$OUT/nvml_bench.txt"
	echo '```'
} | tee -a "$OUT/compare.md"
