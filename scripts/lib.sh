# Shared by the measuring scripts; they source it from the repository
# root: . scripts/lib.sh

# gpu_processes prints how many compute processes NVML lists.
gpu_processes() {
	nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l
}

# wait_gpu_processes N [SECONDS] waits until NVML lists at least N compute
# processes, at most SECONDS (default 180); false if they never came.
wait_gpu_processes() {
	local n=$1 limit=${2:-180}
	for _ in $(seq "$limit"); do
		[ "$(gpu_processes)" -ge "$n" ] && return 0
		sleep 1
	done
	return 1
}

# host_line prints what tells one machine from another in the figures:
# CPUs, their model and clock now, the kernel. Machines of one kind
# (the same GPU) can differ by a factor of two in a scrape's CPU, so every
# figure is read beside this line.
host_line() {
	local model mhz
	model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
	mhz=$(awk -F': *' '/^cpu MHz/ {s += $2; n++} END {if (n) printf "%.0f", s / n}' /proc/cpuinfo)
	echo "cpus $(nproc) (${model:-unknown model}, ${mhz:-?} MHz on average now) kernel $(uname -r)"
}

# unpack FILE DEST copies a binary to DEST, gunzipping FILE.gz where only
# that exists (binaries are carried to a GPU machine gzipped), makes it
# executable and writes it back to disk: the dirty pages of a just-written
# binary stay in memory whatever the exporter asks of the kernel.
unpack() {
	if [ -f "$1" ]; then
		cp "$1" "$2"
	elif [ -f "$1.gz" ]; then
		gunzip -c "$1.gz" >"$2"
	else
		echo "missing $1 (or $1.gz): build it first (scripts/gpu/build.sh)" >&2
		return 1
	fi
	chmod 755 "$2"
	sync
}

# tool NAME prints the command that runs NAME (perf, strace): from PATH,
# or from $PERF_BUNDLE, a tarball of perf/NAME with its libraries and
# loader in perf/lib/ (for a machine that has neither), unpacked into
# $WORK. Prints nothing when neither has it.
tool() {
	if command -v "$1" >/dev/null; then
		command -v "$1"
	elif [ -n "${PERF_BUNDLE:-}" ] && [ -f "$PERF_BUNDLE" ]; then
		[ -d "$WORK/perf" ] || tar -C "$WORK" -xzf "$PERF_BUNDLE"
		[ -x "$WORK/perf/$1" ] && echo "$WORK/perf/lib/ld-linux-x86-64.so.2 --library-path $WORK/perf/lib $WORK/perf/$1"
	fi
}
