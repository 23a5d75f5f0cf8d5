#!/usr/bin/env bash
# One GPU run for the OOM report's context (before/after) and the exporter's
# cost (scrape, poll, idle CPU, RSS), from the repository root, with the
# binaries built here and carried gzipped in .bin/:
#   go build -trimpath -ldflags "-s -w" -o .bin/gpumem_exporter . && go test -c -o .bin/nvmlpoll.test ./nvmlpoll/
#   (and the exporter of an earlier commit as .bin/gpumem_exporter.before), then gzip -9 .bin/*
#   OUT=/tmp/out bash scripts/gpu/issue_checks.sh
set -u
OUT=${OUT:-/tmp/gpumem-checks}
mkdir -p "$OUT" /tmp/bin
for f in .bin/*.gz; do gunzip -c "$f" > /tmp/bin/$(basename "$f" .gz); chmod +x /tmp/bin/$(basename "$f" .gz); done
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/clients/python GPUMEM_INTERVAL=1
URL=http://127.0.0.1:9481
section() { echo; echo "=== $* ==="; }
start() { # binary, then extra flags
  "$@" --allocstats.socket=/run/gpumem/allocstats.sock >"$OUT/$(basename $1).log" 2>&1 &
  EXP=$!
  for _ in $(seq 100); do python3 -c "import urllib.request as u; u.urlopen('$URL/-/ready')" 2>/dev/null && return; sleep 0.1; done
  echo "exporter $1 not ready"; tail -5 "$OUT/$(basename $1).log"
}
stop() { kill $EXP 2>/dev/null; wait $EXP 2>/dev/null; rm -f /run/gpumem/allocstats.sock; }
idle_cpu() { # pid seconds
  a=$(awk '{print $14+$15}' /proc/$1/stat); sleep $2; b=$(awk '{print $14+$15}' /proc/$1/stat)
  python3 -c "print('idle_cpu_percent_of_a_core=%.3f' % (($b-$a)/100.0/$2*100))"
}

section environment
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)'

for bin in gpumem_exporter.before gpumem_exporter; do
  section "$bin: OOM report context"
  start /tmp/bin/$bin
  python3 scripts/gpu/oom_context.py $URL 2>&1 | tail -25
  stop
done

for bin in gpumem_exporter.before gpumem_exporter; do
  section "$bin: cost with one process"
  start /tmp/bin/$bin
  python3 scripts/gpu/hold.py 3072 >/dev/null 2>&1 & H1=$!
  sleep 6
  python3 scripts/gpu/scrape_bench.py $URL/metrics $EXP 100
  idle_cpu $EXP 20
  section "$bin: cost with sixteen processes"
  PIDS=""
  for i in $(seq 15); do python3 scripts/gpu/hold.py 256 >/dev/null 2>&1 & PIDS="$PIDS $!"; done
  for _ in $(seq 60); do n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l); [ "$n" -ge 16 ] && break; sleep 1; done
  sleep 3
  echo "processes on the GPU: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
  python3 scripts/gpu/scrape_bench.py $URL/metrics $EXP 100
  idle_cpu $EXP 20
  grep VmRSS /proc/$EXP/status
  kill $H1 $PIDS 2>/dev/null; wait $H1 $PIDS 2>/dev/null
  stop
done

section "poll cost (nvmlpoll benchmarks on the real GPU, one process)"
python3 scripts/gpu/hold.py 1024 >/dev/null 2>&1 & H1=$!
sleep 5
GPUMEM_REAL_NVML=1 /tmp/bin/nvmlpoll.test -test.run='^$' -test.bench='Real' -test.benchtime=2000x 2>&1 | grep -E '^Benchmark'
kill $H1; wait $H1 2>/dev/null
grep -hE 'level=(error|warn)' "$OUT"/*.log | head -10
echo done
