package collector

import (
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	registerCollector("process", true, newProcessCollector)
}

type processCollector struct {
	src                   Sources
	used, peak, ctx, info *prometheus.Desc
}

func newProcessCollector(src Sources, _ log.Logger) (Collector, error) {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "process", name), help, processLabelNames, nil)
	}
	infoLabels := append(append([]string{}, processLabelNames...), "container_id", "pod_uid", "slurm_job_id", "uid", "framework")
	return &processCollector{
		src:  src,
		used: d("memory_used_bytes", "Device memory the process uses (NVML usedGpuMemory): context plus allocator reserved."),
		peak: d("memory_peak_bytes", "Highest used memory the poller saw since the process appeared on the device."),
		ctx:  d("context_bytes", "Used minus allocator reserved: the CUDA context and memory outside the allocator. Only for processes that report allocator stats."),
		info: prometheus.NewDesc("gpumem_process_info", "What is known about a process on a device.", infoLabels, nil),
	}, nil
}

func (c *processCollector) Update(ch chan<- prometheus.Metric) error {
	return c.updateScrape(&scrape{}, ch)
}

func (c *processCollector) updateScrape(sc *scrape, ch chan<- prometheus.Metric) error {
	rows := sc.rows(c.src)
	if len(rows) == 0 {
		return ErrNoData
	}
	for i := range rows {
		r := &rows[i]
		lv := r.labels()
		if r.NVML != nil && r.NVML.HasUsed {
			ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(r.NVML.UsedBytes), lv...)
			ch <- prometheus.MustNewConstMetric(c.peak, prometheus.GaugeValue, float64(r.NVML.PeakBytes), lv...)
			if ctx, ok := r.Context(); ok {
				ch <- prometheus.MustNewConstMetric(c.ctx, prometheus.GaugeValue, float64(ctx), lv...)
			}
		}
		in := r.Info
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1,
			append(lv, in.ContainerID, in.PodUID, in.SlurmJobID, in.UID, r.Framework)...)
	}
	return nil
}
