// Package dashboards holds gpumem_exporter's Grafana dashboards: fleet.json
// (every node), node.json (one node, GPU by GPU) and workload.json (one pod,
// Slurm job or process). The package has no Go code of its own: its tests
// check that each dashboard parses, that every panel queries the
// ${datasource} variable, that the variables are there and used, that every
// query is valid PromQL (with promtool), that every metric it uses is in
// docs/metrics.md and every recording rule it reads is in
// deploy/prometheus/rules.yml. The end-to-end test in e2e/ runs every query
// against a real Prometheus.
package dashboards
