# Shared by the scripts in scripts/gpu; they source it from the
# repository root: . scripts/gpu/lib.sh

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

# host_line prints what tells one device host from another in the
# figures: CPUs, their model and clock now, the kernel. Hosts of one kind
# have differed by a factor of two in a scrape's CPU (docs/benchmarks.md).
host_line() {
	local model mhz
	model=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
	mhz=$(awk -F': *' '/^cpu MHz/ {s += $2; n++} END {if (n) printf "%.0f", s / n}' /proc/cpuinfo)
	echo "cpus $(nproc) (${model:-unknown model}, ${mhz:-?} MHz on average now) kernel $(uname -r) host $(hostname)"
}
