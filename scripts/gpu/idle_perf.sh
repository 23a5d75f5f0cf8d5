#!/usr/bin/env bash
# Where an idle gpumem_exporter's CPU goes on a real GPU, by perf and
# strace (issue 12's idle target), in one device call. Three exporters of
# one build poll the same GPU every second: A with N PyTorch processes
# (hold.py) reporting to its socket, B with no client (the same processes
# on the GPU, none reporting to it), and C like B with
# --nvml.process-refresh=1h (process lists read only on a change). Then:
#   1. CPU of each over IDLE_SECONDS at once (schedstat), and the mean poll;
#   2. perf record -g of A and of B over PERF_SECONDS at once;
#   3. strace -f -c of A and of B over 30 s at once (system calls and
#      wake-ups by kind);
#   4. NVML's memory by init flags, with malloc_trim (nvml_init_flags.py).
# Meanwhile nvml_memory_changes.py counts how often GPU 0's memory figures
# change (each change makes the exporter read the process lists again).
# Back in $OUT: summary.txt (all of the above) and folded_{A,B,C}.txt (the
# profiles' stacks, one line each; perf_fold.py sums them by kind).
# perf and strace come from $PERF_BUNDLE (a tarball of perf/perf,
# perf/strace and their libraries with the loader, perf/lib/), so the
# machine needs neither. The exporter: $BIN/$EXPORTER(.gz), built with
# symbols (no -s). From the repository root:
#   OUT=/tmp/perf bash scripts/gpu/idle_perf.sh
set -u
. scripts/gpu/lib.sh
OUT=${OUT:-/tmp/gpumem-idle-perf}
BIN=${BIN:-.bin/idle}
EXPORTER=${EXPORTER:-gpumem_exporter_sym}
PERF_BUNDLE=${PERF_BUNDLE:-.bin/perf.tgz}
N=${N:-16}
IDLE_SECONDS=${IDLE_SECONDS:-60}
PERF_SECONDS=${PERF_SECONDS:-120}
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.txt") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python
WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	[ ${#PIDS[@]} -eq 0 ] || wait "${PIDS[@]}" 2>/dev/null # never a bare wait: it would wait for the tee of the output too
	rm -rf "$WORK"
}
trap cleanup EXIT
if [ -f "$BIN/$EXPORTER.gz" ]; then gunzip -c "$BIN/$EXPORTER.gz" >"$WORK/e"; else cp "$BIN/$EXPORTER" "$WORK/e"; fi
chmod +x "$WORK/e"
tar -C "$WORK" -xzf "$PERF_BUNDLE"
LD="$WORK/perf/lib/ld-linux-x86-64.so.2 --library-path $WORK/perf/lib"
PERF="$LD $WORK/perf/perf"
STRACE="$LD $WORK/perf/strace"
{
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	echo "cpus $(nproc) kernel $(uname -r) perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid)"
	$PERF --version
} 2>&1

declare -A EXP PORT
port=9600
for v in A B C; do
	flags=""
	[ "$v" = C ] && flags=--nvml.process-refresh=1h
	# shellcheck disable=SC2086 # the flags are words
	"$WORK/e" --web.listen-address=127.0.0.1:$port --nvml.poll-interval=1s \
		--allocstats.socket="$WORK/$v.sock" $flags >"$WORK/exporter_$v.log" 2>&1 &
	EXP[$v]=$!
	PORT[$v]=$port
	PIDS+=("$!")
	port=$((port + 1))
done
sleep 2
for _ in $(seq "$N"); do
	GPUMEM_SOCKET=$WORK/A.sock python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 &
	PIDS+=("$!")
done
wait_gpu_processes "$N"
sleep 10

echo "=== 1. idle CPU, $IDLE_SECONDS s, no scrapes ==="
python3 scripts/gpu/nvml_memory_changes.py "$IDLE_SECONDS" >"$WORK/memory_changes.txt" 2>&1 &
m=("$!")
for v in A B C; do
	curl -s 127.0.0.1:${PORT[$v]}/metrics | grep -E '^gpumem_nvml_poll_duration_seconds_(sum|count) ' | awk '{print $2}' | paste -sd ' ' >"$WORK/poll0_$v"
	python3 scripts/gpu/peer_bench.py idle "${EXP[$v]}" "$IDLE_SECONDS" >"$WORK/idle_$v" &
	m+=("$!")
done
wait "${m[@]}"
for v in A B C; do
	poll=$(curl -s 127.0.0.1:${PORT[$v]}/metrics | grep -E '^gpumem_nvml_poll_duration_seconds_(sum|count) ' | awk '{print $2}' | paste -sd ' ' |
		awk -v f="$WORK/poll0_$v" 'BEGIN { getline l < f; split(l, a, " ") } { printf "%.1f", ($1 - a[1]) / ($2 - a[2]) * 1e6 }')
	rss=$(grep -E '^(VmRSS|RssAnon|RssFile):' /proc/${EXP[$v]}/status | awk '{printf "%s%.1f", (NR>1?",":""), $2/1024}')
	python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.update(exporter=sys.argv[2], mean_poll_us=float(sys.argv[3]), rss_anon_file_mib=sys.argv[4]); print(json.dumps(d))" \
		"$WORK/idle_$v" "$v" "$poll" "$rss"
done
cat "$WORK/memory_changes.txt"
curl -s 127.0.0.1:${PORT[A]}/metrics | grep -E '^gpumem_allocstats_(messages_total\{result="ok"|connections )'

echo "=== 2. perf record, $PERF_SECONDS s ==="
m=()
for v in A B C; do
	$PERF record -F 1999 -g -p "${EXP[$v]}" -o "$WORK/perf_$v.data" -- sleep "$PERF_SECONDS" >"$WORK/perf_record_$v.txt" 2>&1 &
	m+=("$!")
done
wait "${m[@]}"
for v in A B C; do
	echo "-- $v"
	tail -2 "$WORK/perf_record_$v.txt"
	$PERF script -F comm,tid,ip,sym,dso -i "$WORK/perf_$v.data" 2>/dev/null | python3 scripts/gpu/perf_fold.py --folded "$OUT/folded_$v.txt"
	$PERF report -i "$WORK/perf_$v.data" --no-children --sort dso --stdio 2>&1 | grep -E '^ +[0-9]' | head -8
done

echo "=== 3. strace -c, 30 s ==="
m=()
for v in A B; do
	timeout -s INT 30 $STRACE -f -c -p "${EXP[$v]}" -o "$WORK/strace_$v.txt" >/dev/null 2>&1 &
	m+=("$!")
done
wait "${m[@]}"
for v in A B; do
	echo "-- $v"
	head -25 "$WORK/strace_$v.txt"
done

for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
[ ${#PIDS[@]} -eq 0 ] || wait "${PIDS[@]}" 2>/dev/null
PIDS=()
echo "=== 4. NVML memory, malloc_trim ==="
python3 scripts/gpu/nvml_init_flags.py 0 2>&1
