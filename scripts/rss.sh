#!/usr/bin/env bash
# RSS of one gpumem_exporter binary with and without
# --runtime.release-startup-pages, Kubernetes off and then
# watching the pods of `scripts/measure.py apiserver`. Each configuration
# polls every second and is scraped (gzip) once a second for
# SCRAPE_SECONDS; then VmRSS, RssAnon and RssFile from /proc/PID/status.
#   EXPORTER=/tmp/gpumem_exporter bash scripts/rss.sh
# (EXPORTER may be gzipped: .bin/gpumem_exporter for .bin/gpumem_exporter.gz.)
# BACKEND=simulated (default) or nvml (on a GPU node). RUNAS=65532 runs
# the exporter as that user (setpriv), as the DaemonSet does; the binary
# stays root's (as in the image) unless OWN=1 gives it to that user: the
# kernel reclaims file pages on MADV_PAGEOUT only for a process that may
# write the file. ROUNDS repeats the four configurations.
set -u
EXPORTER=${EXPORTER:?the binary to measure}
BACKEND=${BACKEND:-simulated}
PODS=${PODS:-110}
SCRAPE_SECONDS=${SCRAPE_SECONDS:-30}
ROUNDS=${ROUNDS:-1}
RUNAS=${RUNAS:-}
PORT=${PORT:-9612}
API_PORT=${API_PORT:-9613}
WORK=$(mktemp -d)
chmod 755 "$WORK"
mkdir -m 1777 "$WORK/sock"
. "$(dirname "$0")/lib.sh"
unpack "$EXPORTER" "$WORK/gpumem_exporter" || exit 1 # gzipped or not, written back to disk
[ -z "$RUNAS" ] || [ "${OWN:-}" != 1 ] || chown "$RUNAS:$RUNAS" "$WORK/gpumem_exporter"
sync
API=
cleanup() {
	[ -z "$API" ] || kill "$API" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT

python3 "$(dirname "$0")/measure.py" apiserver "$API_PORT" "$PODS" gpu-node-1 >"$WORK/api.out" 2>"$WORK/api.err" &
API=$!
for _ in $(seq 50); do [ -s "$WORK/api.out" ] && break; sleep 0.1; done
KUBECONFIG_FILE=$(head -1 "$WORK/api.out")
cp "$KUBECONFIG_FILE" "$WORK/kubeconfig" && chmod 644 "$WORK/kubeconfig"
cat "$WORK/api.err"
echo "backend $BACKEND, user ${RUNAS:-$(id -u)}, binary owned by $(stat -c %u "$WORK/gpumem_exporter"), kernel $(uname -r), binary $(stat -c %s "$WORK/gpumem_exporter") bytes"

as_user=()
[ -z "$RUNAS" ] || as_user=(setpriv --reuid="$RUNAS" --regid="$RUNAS" --clear-groups)
metric() { curl -s "127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

measure() { # name, flags...
	local name=$1
	shift
	"${as_user[@]}" "$WORK/gpumem_exporter" --web.listen-address="127.0.0.1:$PORT" \
		--nvml.backend="$BACKEND" --nvml.poll-interval=1s \
		--allocstats.socket="$WORK/sock/s.sock" "$@" >"$WORK/exporter.log" 2>&1 &
	local pid=$!
	for _ in $(seq 100); do curl -sf "127.0.0.1:$PORT/-/ready" >/dev/null && break; sleep 0.1; done
	for _ in $(seq "$SCRAPE_SECONDS"); do
		curl -s --compressed "127.0.0.1:$PORT/metrics" >/dev/null
		sleep 1
	done
	local pods
	pods=$(metric gpumem_kubernetes_pods)
	printf '%-24s %s pods=%s\n' "$name" "$(grep -E '^(VmRSS|RssAnon|RssFile):' "/proc/$pid/status" | awk '{printf "%s %.1f MiB  ", $1, $2/1024}')" "${pods:--}"
	kill "$pid"
	wait "$pid" 2>/dev/null
}

for _ in $(seq "$ROUNDS"); do
	measure "off, release" --runtime.release-startup-pages
	measure "off, keep" --no-runtime.release-startup-pages
	measure "$PODS pods, release" --runtime.release-startup-pages --kubernetes.kubeconfig="$WORK/kubeconfig" --kubernetes.node-name=gpu-node-1
	measure "$PODS pods, keep" --no-runtime.release-startup-pages --kubernetes.kubeconfig="$WORK/kubeconfig" --kubernetes.node-name=gpu-node-1
done
grep -m1 "start-up" "$WORK/exporter.log" || true
