#!/usr/bin/env bash
# Measures what N gpumem_exporter nodes cost one Prometheus: one simulated
# exporter is scraped as N node targets (each relabelled to its own
# instance, so that the series multiply as on a fleet), rules.yml and
# fleet-rules.yml loaded, scrape and evaluation every 15 s. At the end it
# prints series per node, samples/s per node (rule output included),
# memory per head series, churn, each rule group's evaluation time, the
# slowest rules, and how long each panel of the fleet dashboard (and the
# workload dashboard with every instance picked) takes to answer; then
# where one Prometheus stops and how many shards 10,000 nodes need.
#
#   scripts/scaling.sh                 # N=400, pid mode, 4 minutes
#   N=800 MODE=pod DURATION=300 scripts/scaling.sh
#
# N: node targets; MODE: pid or pod (--collector.process.aggregate);
# DURATION: seconds of scraping before the figures are read; SCENARIO: the
# simulated node's scenario (mix); PROMETHEUS: the binary (Debian's 2.42 on
# PATH by default); PORT_BASE: the exporter listens on PORT_BASE, Prometheus
# on PORT_BASE+1 (19481); EXPORTER: a built exporter instead of building
# one with go; RULES, FLEET_RULES, FLEET_DASHBOARD, WORKLOAD_DASHBOARD:
# other rule files and dashboards than this tree's (to compare with an
# older version). Needs python3 and prometheus (and go without EXPORTER).
# Run it on an otherwise idle machine: a group's rules run one after the
# other on one core, and a busy machine slows them as much as it is busy.
set -euo pipefail

N=${N:-400}
MODE=${MODE:-pid}
DURATION=${DURATION:-240}
SCENARIO=${SCENARIO:-mix}
PROMETHEUS=${PROMETHEUS:-prometheus}
PORT_BASE=${PORT_BASE:-19481}
case $MODE in pid | pod) ;; *) echo "scripts/scaling.sh: MODE is pid or pod, not $MODE" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
RULES=${RULES:-$root/deploy/prometheus/rules.yml}
FLEET_RULES=${FLEET_RULES:-$root/deploy/prometheus/fleet-rules.yml}
FLEET_DASHBOARD=${FLEET_DASHBOARD:-$root/dashboards/fleet.json}
WORKLOAD_DASHBOARD=${WORKLOAD_DASHBOARD:-$root/dashboards/workload.json}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpumem-scaling.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

exporter_addr=127.0.0.1:$PORT_BASE
prom_addr=127.0.0.1:$((PORT_BASE + 1))

exporter=${EXPORTER:-}
if [ -z "$exporter" ]; then
  exporter=$work/gpumem_exporter
  (cd "$root" && CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$exporter" .)
fi
"$exporter" --nvml.backend=simulated --nvml.simulated.scenario="$SCENARIO" \
  --collector.process.aggregate="$MODE" --web.listen-address="$exporter_addr" \
  --web.max-connections=$((N + 64)) \
  --allocstats.socket="$work/a.sock" >"$work/exporter.log" 2>&1 &
pids+=($!)

# N targets of one address, told apart by a node label that becomes the
# instance. Both rule files, with the fleet groups' own 1m interval.
{
  cat <<EOF
global:
  scrape_interval: 15s
  scrape_timeout: 10s
  evaluation_interval: 15s
rule_files:
  - $RULES
  - $FLEET_RULES
scrape_configs:
  - job_name: prometheus
    static_configs: [{targets: ['$prom_addr']}]
  - job_name: gpumem
    honor_labels: true
    relabel_configs:
      - {source_labels: [node], target_label: instance}
      - {regex: node, action: labeldrop}
    static_configs:
EOF
  for i in $(seq 1 "$N"); do printf "      - {targets: ['%s'], labels: {node: 'gpu-node-%05d:9481'}}\n" "$exporter_addr" "$i"; done
} >"$work/prometheus.yml"
"$PROMETHEUS" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="$prom_addr" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!)

for _ in $(seq 60); do curl -fs "http://$prom_addr/-/ready" >/dev/null 2>&1 && break; sleep 1; done
if ! curl -fs "http://$prom_addr/-/ready" >/dev/null 2>&1; then
  echo "scripts/scaling.sh: Prometheus is not ready on $prom_addr (port in use? PORT_BASE picks others):" >&2
  tail -5 "$work/prometheus.log" >&2
  exit 1
fi
echo "scraping $N nodes ($SCENARIO, $MODE mode) for ${DURATION}s ..." >&2
sleep "$DURATION"

python3 - "http://$prom_addr" "$N" "$MODE" "$DURATION" "$FLEET_DASHBOARD" "$WORKLOAD_DASHBOARD" <<'PY'
import json, math, sys, time, urllib.parse, urllib.request

prom, n, mode, duration, fleet, workload = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]

def api(path, **params):
    url = prom + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=120) as r:
        return json.load(r)["data"]

def scalar(expr):
    res = api("/api/v1/query", query=expr)["result"]
    return float(res[0]["value"][1]) if res else float("nan")

now = time.time()
win = "%ds" % max(60, min(duration - 60, 180))  # the steady part of the run
head = scalar("prometheus_tsdb_head_series")
scraped = scalar('avg(scrape_samples_scraped{job="gpumem"})')
samples = scalar("rate(prometheus_tsdb_head_samples_appended_total[%s])" % win)
created = scalar("rate(prometheus_tsdb_head_series_created_total[%s])" % win)
rss = scalar("process_resident_memory_bytes{job='prometheus'}")
print(f"nodes {n}, {mode} mode, {duration} s; figures over the last {win}")
print(f"series per node: {scraped:.0f} scraped, {head / n:.0f} in the head")
print(f"samples/s per node (rule output included): {samples / n:.1f}")
print(f"memory: RSS {rss / 2**30:.2f} GiB, {rss / head / 1000:.1f} KB per head series")
print(f"churn: {created * 3600 / n:.0f} series created per node per hour")

groups = api("/api/v1/rules")["groups"]
print("\nrule group: evaluation time average / max over the window (last), interval")
worst_share = 0.0
per_k = {}  # average seconds per evaluation per 1,000 nodes
for g in groups:
    name = g["name"]
    q = 'prometheus_rule_group_last_duration_seconds{rule_group=~".*;%s"}' % name
    avg = scalar("avg_over_time(%s[%s])" % (q, win))
    mx = scalar("max_over_time(%s[%s])" % (q, win))
    per_k[name] = avg / n * 1000
    share = mx / g["interval"]
    worst_share = max(worst_share, share)
    print(f"  {name:24s} {avg:.3f} / {mx:.3f} s ({g['evaluationTime']:.3f}) of {g['interval']:.0f} s: {100 * share:.1f}% at most")
rules = sorted(((r["evaluationTime"], r.get("name"), g["name"]) for g in groups for r in g["rules"]), reverse=True)
print("slowest rules (last evaluation):")
for t, name, gname in rules[:6]:
    print(f"  {t:.3f} s  {name} ({gname})")

def panel_exprs(path):
    d = json.load(open(path))
    def walk(ps):
        for p in ps:
            yield from walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield p.get("title", ""), t
    return list(walk(d["panels"]))

def substitute(expr, rng):
    for k, v in (("${workload:regex}", ".+"), ("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", rng)):
        expr = expr.replace(k, v)
    for var in ("job", "instance", "gpu", "namespace", "pod", "workload"):
        expr = expr.replace("$" + var, ".*")
    return expr

def time_panels(name, path, workload=None):
    rng, span = "10m", 600
    rows = []
    for title, t in panel_exprs(path):
        expr = substitute(t["expr"], rng)
        if workload:
            expr = expr.replace('workload=~".+"', 'workload=~"%s"' % workload)
        took = []
        for _ in range(3):  # the median of three: one answer can land on a rule evaluation
            began = time.monotonic()
            if t.get("instant"):
                api("/api/v1/query", query=expr, time=now)
            else:
                api("/api/v1/query_range", query=expr, start=now - span, end=now, step=15)
            took.append(time.monotonic() - began)
        rows.append((sorted(took)[1], title))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\n{name}: {len(rows)} queries, {total:.2f} s in all; slowest:")
    for secs, title in rows[:5]:
        print(f"  {secs:.3f} s  {title}")
    return rows[0][0] if rows else 0.0

slowest_fleet = time_panels("fleet.json (every variable All, 10 minutes)", fleet)
wl = api("/api/v1/query", query="topk(1, count by (workload) (gpumem_process_info{pod!=\"\"}))", time=now)["result"]
if wl:
    w = wl[0]["metric"]["workload"]
    time_panels(f"workload.json ($instance All, workload {w})", workload, w)

# Where one Prometheus stops: the slowest group's evaluation grows in
# proportion to nodes; it must stay well inside its interval (half of it
# here). Memory: the head at the measured bytes per head series.
limit_rules = min(0.5 * g["interval"] / (per_k[g["name"]] / 1000) for g in groups if per_k[g["name"]] > 0)
mem_budget = 64 * 2**30
limit_mem = mem_budget / 2 / (rss / n)  # half the machine for the head
print("\nrule evaluation per 1,000 nodes: " + ", ".join(f"{k} {v:.2f} s" for k, v in per_k.items()))
print(f"one Prometheus stops at about {min(limit_rules, limit_mem):,.0f} nodes (rules at half their interval: {limit_rules:,.0f}; head in half of {mem_budget / 2**30:.0f} GiB: {limit_mem:,.0f})")
print(f"10,000 nodes need {math.ceil(10000 / min(limit_rules, limit_mem))} shards at that bound")
print(f"\ndone when: every group under 5% of its interval: {'yes' if worst_share < 0.05 else 'no'} ({100 * worst_share:.1f}%); every fleet panel under 0.15 s: {'yes' if slowest_fleet < 0.15 else 'no'} ({slowest_fleet:.3f} s)")
PY
