package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/attribution"
)

// Sources are what collectors read. Join is a value that every collector
// gets; within it, a nil source (NVML, Allocator, Workload) only leaves
// its figures out of the rows, and without an Allocator the allocator
// collector is not built. A nil health collector is not built either. A
// collector that is not built exports nothing, not even its
// scrape_collector_* series.
type Sources struct {
	// Join is the NVML snapshot, the allocator store and the workload
	// cache, joined once per scrape for every collector.
	Join attribution.Sources
	// The sources' own health: the NVML poller (gpumem_nvml_*), the
	// socket server (gpumem_allocstats_*) and the pod watch
	// (gpumem_kubernetes_*).
	NVMLHealth       prometheus.Collector
	AllocstatsHealth prometheus.Collector
	KubernetesHealth prometheus.Collector
}
