// Package dashboards holds gpumem_exporter's Grafana dashboard (gpumem.json).
// The package has no Go code of its own: its tests check that the dashboard
// parses, that every panel queries the ${datasource} variable, that every
// query is valid PromQL (with promtool) and that every metric it uses is in
// docs/metrics.md.
package dashboards
