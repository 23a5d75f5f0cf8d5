package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/attribution"
)

// Sources are what collectors read. Any field may be nil: a collector
// whose source is nil is not built (it exports nothing, not even its
// scrape_collector_* series).
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
