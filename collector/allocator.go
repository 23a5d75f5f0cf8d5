package collector

import (
	"github.com/go-kit/log"
	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	registerCollector("allocator", true, newAllocatorCollector)
}

type allocatorCollector struct {
	reserved, active, inactive, allocated, split     *prometheus.Desc
	peakReserved, peakActive, limit                  *prometheus.Desc
	retries, ooms, lastOOMRequest, lastOOMTime, last *prometheus.Desc
}

func newAllocatorCollector(src Sources, _ log.Logger) (Collector, error) {
	if src.Join.Allocator == nil {
		return nil, nil
	}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "allocator", name), help, processLabelNames, nil)
	}
	return &allocatorCollector{
		reserved:       d("reserved_bytes", "Memory the framework's caching allocator holds from the device (active + inactive)."),
		active:         d("active_bytes", "Allocator memory in active blocks (live tensors)."),
		inactive:       d("inactive_bytes", "Allocator memory cached in blocks no tensor uses (reserved - active)."),
		allocated:      d("allocated_bytes", "Allocator memory allocated to tensors (<= active)."),
		split:          d("inactive_split_bytes", "Inactive memory in split segments, which empty_cache() cannot return."),
		peakReserved:   d("peak_reserved_bytes", "The framework's peak of reserved memory."),
		peakActive:     d("peak_active_bytes", "The framework's peak of active memory."),
		limit:          d("limit_bytes", "The process's memory limit, where one is set."),
		retries:        d("alloc_retries_total", "Times the allocator flushed its cache and retried cudaMalloc."),
		ooms:           d("ooms_total", "Out-of-memory errors the allocator raised."),
		lastOOMRequest: d("last_oom_request_bytes", "Bytes the last failed allocation asked for."),
		lastOOMTime:    d("last_oom_timestamp_seconds", "When the last out-of-memory event was reported."),
		last:           d("last_report_timestamp_seconds", "When the process last reported its allocator state."),
	}, nil
}

func (c *allocatorCollector) Update(sc *Scrape, ch chan<- prometheus.Metric) error {
	v := sc.View()
	if v.Snapshot == nil || len(v.Snapshot.Devices) == 0 {
		return ErrNoData // no device to label a report with
	}
	rows := v.Rows
	for i := range rows {
		r := &rows[i]
		a := r.Alloc
		if a == nil {
			continue
		}
		lv := labels(r)
		gauge := func(desc *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(v), lv...)
		}
		gauge(c.reserved, a.Reserved)
		if a.Active.OK {
			gauge(c.active, a.Active.V)
			gauge(c.inactive, a.Inactive())
		}
		for _, o := range []struct {
			desc *prometheus.Desc
			v    allocstats.Optional
		}{
			{c.allocated, a.Allocated}, {c.split, a.InactiveSplit}, {c.peakReserved, a.PeakReserved},
			{c.peakActive, a.PeakActive}, {c.limit, a.Limit}, {c.lastOOMRequest, a.LastOOMRequest},
		} {
			if o.v.OK {
				gauge(o.desc, o.v.V)
			}
		}
		if a.AllocRetries.OK {
			ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(a.AllocRetries.V), lv...)
		}
		if a.OOMs.OK {
			ch <- prometheus.MustNewConstMetric(c.ooms, prometheus.CounterValue, float64(a.OOMs.V), lv...)
		}
		if !a.LastOOMTime.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.lastOOMTime, prometheus.GaugeValue, float64(a.LastOOMTime.UnixNano())/1e9, lv...)
		}
		if !a.LastReport.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, float64(a.LastReport.UnixNano())/1e9, lv...)
		}
	}
	return nil
}
