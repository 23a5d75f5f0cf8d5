package collector

import (
	"strconv"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/attribution"
)

// processLabelNames are the per-process labels fixed by the spec.
var processLabelNames = []string{"gpu", "uuid", "pid", "comm", "namespace", "pod", "container"}

// labels are the values of processLabelNames for r.
func labels(r *attribution.Row) []string {
	return []string{r.GPU, r.UUID, strconv.FormatUint(uint64(r.PID), 10), r.Comm, r.Info.Namespace, r.Info.Pod, r.Info.Container}
}

func init() {
	registerCollector("process", true, newProcessCollector)
}

type processCollector struct {
	used, peak, ctx, info *prometheus.Desc
}

func newProcessCollector(_ Sources, _ log.Logger) (Collector, error) {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "process", name), help, processLabelNames, nil)
	}
	infoLabels := append(append([]string{}, processLabelNames...), "container_id", "pod_uid", "slurm_job_id", "uid", "framework")
	return &processCollector{
		used: d("memory_used_bytes", "Device memory the process uses (NVML usedGpuMemory): context plus allocator reserved."),
		peak: d("memory_peak_bytes", "Highest used memory the poller saw since the process appeared on the device."),
		ctx:  d("context_bytes", "Used minus allocator reserved: the CUDA context and memory outside the allocator. Only for processes that report allocator stats."),
		info: prometheus.NewDesc(prometheus.BuildFQName(namespace, "process", "info"), "What is known about a process on a device.", infoLabels, nil),
	}, nil
}

func (c *processCollector) Update(sc *Scrape, ch chan<- prometheus.Metric) error {
	v := sc.View()
	if v.Snapshot == nil || len(v.Snapshot.Devices) == 0 {
		return ErrNoData
	}
	rows := v.Rows
	for i := range rows {
		r := &rows[i]
		lv := labels(r)
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
