// Package e2e runs gpumem_exporter end to end: the real binary, built from
// this module, serving its simulated node (scenario mix, sped up), scraped by
// a real Prometheus that loads deploy/prometheus/rules.yml. Its tests check
// what no unit test can: that every query of every dashboard in dashboards/
// returns data, that every variable has values, and that the out-of-memory
// panels count each error once.
//
// The package has no Go code of its own. Its tests need `prometheus` on
// PATH (Debian: apt-get install prometheus); without it they are skipped,
// except in CI. GPUMEM_E2E_EXPORTER names a prebuilt exporter binary to use
// instead of building one.
package e2e
