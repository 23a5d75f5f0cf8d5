#!/usr/bin/env bash
# The daemon at rest with 16 reporting clients, on a machine without a GPU:
# the simulated backend (load scenario, one simulated process per GPU) and
# 16 scripts/fake_clients.py processes started 0.63 s apart, one round per
# client version in ROUNDS ("new" is clients/python; "old" is OLD_CLIENT, a
# copy of another commit's clients/python). Each round: CPU over 60 s
# (schedstat of every thread), then system calls over 30 s (strace -f -c).
#   git archive <commit> clients/python/gpumem | tar -x -C /tmp/old
#   OLD_CLIENT=/tmp/old/clients/python ROUNDS="old new old new" bash scripts/idle_clients.sh
# EXPORTER is a built gpumem_exporter (default ./gpumem_exporter).
set -u
ROUNDS=${ROUNDS:-old new}
EXPORTER=${EXPORTER:-./gpumem_exporter}
OLD_CLIENT=${OLD_CLIENT:-}
UUID=GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000000 # the simulated node's GPU 0
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cpu() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{t += $1} END {print t}'; }
metric() { curl -s 127.0.0.1:9813/metrics | grep -E "^$1 " | awk '{print $2}'; }
for v in $ROUNDS; do
	pkg=$PWD/clients/python
	if [ "$v" = old ]; then pkg=$OLD_CLIENT; fi
	"$EXPORTER" --nvml.backend=simulated --nvml.simulated.scenario=load --nvml.simulated.processes-per-gpu=1 \
		--web.listen-address=127.0.0.1:9813 --allocstats.socket="$W/s.sock" >"$W/exporter.log" 2>&1 &
	E=$!
	sleep 1
	python3 scripts/fake_clients.py 16 "$W/s.sock" "$pkg" "$UUID" &
	C=$!
	sleep 25
	conns=$(metric gpumem_allocstats_connections)
	m0=$(metric 'gpumem_allocstats_messages_total\{result="ok",type="stats"\}')
	a=$(cpu $E)
	sleep 60
	b=$(cpu $E)
	m1=$(metric 'gpumem_allocstats_messages_total\{result="ok",type="stats"\}')
	timeout -s INT 30 strace -f -c -p "$E" -o "$W/strace.txt" >/dev/null 2>&1
	calls=$(awk '$NF ~ /^(epoll_pwait|futex|nanosleep)$/ {printf "%s %s, ", $NF, $4}' "$W/strace.txt")
	echo "$v: $conns connections, $((m1 - m0)) stats lines in 60 s, CPU $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", (b - a) / 60 / 1e7}')% of a core; in 30 s: ${calls%, }"
	kill "$C"
	wait "$C" 2>/dev/null
	kill "$E"
	wait "$E" 2>/dev/null
done
