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
