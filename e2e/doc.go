// Package e2e runs gpumem_exporter end to end: the real binary, built from
// this module, as a process. By what they test:
//
//   - exporter_test.go, flags_test.go: the exporter alone on its simulated
//     node: every metric of docs/metrics.md served and promtool-clean,
//     readiness and health, TLS and basic auth, the socket protocol from a
//     client's side, flags that fail cleanly, no leaked descriptors.
//   - warning_test.go: the daemon's warning of a foreseen OOM, to
//     instrumented processes (this test binary re-executed, one pid each)
//     that push in real time for two minutes: a leak is warned in time
//     with an estimate close to the truth, steady training is not.
//   - kubernetes_test.go: real instrumented processes (this test binary
//     re-executed as a client) named with their pods through a test
//     Kubernetes API server and a fixture /proc.
//   - stack_test.go, dashboards_test.go, shards_test.go: the exporter
//     scraped by a real Prometheus that loads deploy/prometheus/rules.yml:
//     every query of every dashboard in dashboards/ returns data, every
//     variable has values, the out-of-memory panels count each error once.
//     These need `prometheus` on PATH (Debian: apt-get install prometheus);
//     without it they are skipped, except in CI.
//   - alertmanager_test.go: the alerts of the simulated multi-rank job
//     through Prometheus and a real Alertmanager running
//     deploy/alertmanager/alertmanager.yml to a webhook: grouping by
//     workload, the OOM notification's cause, inhibition, resolution. It
//     also needs prometheus-alertmanager (Debian).
//
// The attacks of docs/security.md, against the same binary, are in attack/.
// The package has no Go code of its own. GPUMEM_E2E_EXPORTER names a
// prebuilt exporter binary to use instead of building one.
package e2e
