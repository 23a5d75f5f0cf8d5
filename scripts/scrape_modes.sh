#!/usr/bin/env bash
# CPU and latency of a scrape of one gpumem_exporter binary in each of
# peer_bench.py's modes (plain, gzip, keepalive, gzip-keepalive: a new
# connection each, or one kept open as Prometheus does), without a GPU:
# the simulated backend's default node, polled every second.
#   EXPORTER=/tmp/gpumem_exporter bash scripts/scrape_modes.sh [FLAG...]
# N (default 300) scrapes per mode; one JSON line per mode.
set -u
EXPORTER=${EXPORTER:?the binary to measure}
N=${N:-300}
PORT=${PORT:-9711}
WORK=$(mktemp -d)
E=
cleanup() {
	[ -z "$E" ] || kill "$E" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
# Written back first: a just-written binary's dirty pages stay resident.
cp "$EXPORTER" "$WORK/gpumem_exporter"
sync
"$WORK/gpumem_exporter" --web.listen-address="127.0.0.1:$PORT" --nvml.backend=simulated \
	--nvml.poll-interval=1s --allocstats.socket="$WORK/s.sock" "$@" >"$WORK/log" 2>&1 &
E=$!
for _ in $(seq 50); do curl -sf "127.0.0.1:$PORT/-/ready" >/dev/null && break; sleep 0.1; done
sleep 3
for what in plain gzip keepalive gzip-keepalive; do
	python3 "$(dirname "$0")/gpu/peer_bench.py" scrapes "http://127.0.0.1:$PORT/metrics" "$E" "$N" "$what" |
		python3 -c "import json,sys; d=json.load(sys.stdin); d['what']=sys.argv[1]; print(json.dumps(d))" "$what"
done
