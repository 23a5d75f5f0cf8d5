// Package prometheus holds gpumem_exporter's Prometheus recording rules and
// alerts (rules.yml), their promtool unit tests (rules_test.yml, and rules_podmode_test.yml for
// --collector.process.aggregate=pod with containers sharing a GPU) and the
// same groups as a Prometheus Operator PrometheusRule (prometheusrule.yaml,
// generated from rules.yml). The package has no Go code of its own: its
// tests check the rules with promtool, check every metric they use against
// docs/metrics.md, and measure the alerts' lead time before each OOM of the
// simulated workloads of simulate/scenario (TestAlertLeadTime).
package prometheus
