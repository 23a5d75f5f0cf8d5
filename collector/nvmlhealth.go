package collector

import (
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	registerCollector("nvml", true, newNVMLCollector)
}

// nvmlCollector exports the poller's health: gpumem_nvml_up, poll
// durations and failed calls.
type nvmlCollector struct{ health prometheus.Collector }

func newNVMLCollector(src Sources, _ log.Logger) (Collector, error) {
	return &nvmlCollector{health: src.NVMLHealth}, nil
}

func (c *nvmlCollector) Update(ch chan<- prometheus.Metric) error {
	if c.health == nil {
		return ErrNoData
	}
	c.health.Collect(ch)
	return nil
}
