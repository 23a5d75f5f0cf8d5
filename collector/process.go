package collector

import (
	"strconv"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/attribution"
)

// The per-process labels fixed by the spec and the workload the process
// belongs to (attribution.Row.Workload), and those of process_info.
var (
	processSchema     = newSchema("gpu", "uuid", "pid", "comm", "namespace", "pod", "container", "workload")
	processInfoSchema = newSchema(append(append([]string{}, processSchema.names...), "container_id", "pod_uid", "slurm_job_id", "uid", "framework")...)
)

// processLabels returns the labels of row(i) in processSchema or
// processInfoSchema; node names the workload of a process outside pods
// and Slurm jobs. An aggregated row (no pid) has empty pid and comm.
func processLabels(row func(i int) *attribution.Row, node string) func(i int, s *schema) []string {
	return func(i int, s *schema) []string {
		r := row(i)
		pid := ""
		if r.PID != 0 {
			pid = strconv.FormatUint(uint64(r.PID), 10)
		}
		in := r.Info
		if s == processSchema {
			return []string{r.GPU, r.UUID, pid, r.Comm, in.Namespace, in.Pod, in.Container, r.Workload(node)}
		}
		return []string{r.GPU, r.UUID, pid, r.Comm, in.Namespace, in.Pod, in.Container, r.Workload(node), in.ContainerID, in.PodUID, in.SlurmJobID, in.UID, r.Framework}
	}
}

func init() {
	registerCollector("process", true, newProcessCollector)
}

type processCollector struct {
	used, peak, ctx, info *family
}

func newProcessCollector(_ Sources, _ log.Logger) (Collector, error) {
	d := func(name, help string) *family {
		return newFamily(prometheus.BuildFQName(namespace, "process", name), help, prometheus.GaugeValue, processSchema)
	}
	return &processCollector{
		used: d("memory_used_bytes", "Device memory the process uses (NVML usedGpuMemory): context plus allocator reserved."),
		peak: d("memory_peak_bytes", "Highest used memory the poller saw since the process appeared on the device."),
		ctx:  d("context_bytes", "Used minus allocator reserved: the CUDA context and memory outside the allocator. Only for processes that report allocator stats."),
		info: newFamily(prometheus.BuildFQName(namespace, "process", "info"), "What is known about a process on a device.", prometheus.GaugeValue, processInfoSchema),
	}, nil
}

func (c *processCollector) Update(sc *Scrape, ch chan<- prometheus.Metric) error {
	return updateRows(c, sc, ch)
}

func (c *processCollector) rows(sc *Scrape) (*rowSet, error) {
	v := sc.View()
	if v.Snapshot == nil || len(v.Snapshot.Devices) == 0 {
		return nil, ErrNoData
	}
	rows := sc.Rows()
	nvml := func(f func(r *attribution.Row) (uint64, bool)) func(i int) (float64, bool) {
		return func(i int) (float64, bool) {
			r := &rows[i]
			if r.NVML == nil || !r.NVML.HasUsed {
				return 0, false
			}
			v, ok := f(r)
			return float64(v), ok
		}
	}
	return &rowSet{
		n:      len(rows),
		labels: processLabels(func(i int) *attribution.Row { return &rows[i] }, sc.src.Node),
		columns: []column{
			{c.used, nvml(func(r *attribution.Row) (uint64, bool) { return r.NVML.UsedBytes, true })},
			{c.peak, nvml(func(r *attribution.Row) (uint64, bool) { return r.NVML.PeakBytes, true })},
			{c.ctx, nvml(func(r *attribution.Row) (uint64, bool) { return r.Context() })},
			{c.info, func(int) (float64, bool) { return 1, true }},
		},
	}, nil
}
