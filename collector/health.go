package collector

import (
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	registerCollector("nvml", true, func(src Sources, _ log.Logger) (Collector, error) {
		return healthCollector(src.NVMLHealth), nil
	})
	registerCollector("allocstats", true, func(src Sources, _ log.Logger) (Collector, error) {
		return healthCollector(src.AllocstatsHealth), nil
	})
	registerCollector("kubernetes", true, func(src Sources, _ log.Logger) (Collector, error) {
		return healthCollector(src.KubernetesHealth), nil
	})
}

// health passes on a source's own metrics (the NVML poller's, the socket
// server's, the pod watch's) under a --collector flag like every other.
type health struct{ c prometheus.Collector }

func healthCollector(c prometheus.Collector) Collector {
	if c == nil {
		return nil
	}
	return health{c}
}

func (h health) Update(_ *Scrape, ch chan<- prometheus.Metric) error {
	h.c.Collect(ch)
	return nil
}
