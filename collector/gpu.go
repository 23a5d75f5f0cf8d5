package collector

import (
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	registerCollector("gpu", true, newGPUCollector)
}

var gpuLabels = []string{"gpu", "uuid"}

type gpuCollector struct {
	info                                *prometheus.Desc
	total, used, free, reserved, unattr *prometheus.Desc
	processes                           *prometheus.Desc
}

func newGPUCollector(_ Sources, _ log.Logger) (Collector, error) {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "gpu", name), help, gpuLabels, nil)
	}
	return &gpuCollector{
		info: prometheus.NewDesc(prometheus.BuildFQName(namespace, "gpu", "info"), "GPU or MIG instance identity; parent_uuid names the GPU a MIG instance belongs to.",
			[]string{"gpu", "uuid", "name", "pci_bus_id", "driver_version", "cuda_driver_version", "mig_mode", "parent_uuid"}, nil),
		total:     d("memory_total_bytes", "Total device memory (NVML)."),
		used:      d("memory_used_bytes", "Device memory used (NVML v2: excludes the driver's reservation)."),
		free:      d("memory_free_bytes", "Device memory free (NVML)."),
		reserved:  d("memory_reserved_bytes", "Device memory the driver and firmware reserve (NVML v2 only)."),
		unattr:    d("memory_unattributed_bytes", "Used memory not accounted for by any listed process (never below 0)."),
		processes: d("processes", "Processes holding a context on the device."),
	}, nil
}

func (c *gpuCollector) Update(sc *Scrape, ch chan<- prometheus.Metric) error {
	snap := sc.View().Snapshot
	if snap == nil || len(snap.Devices) == 0 {
		return ErrNoData
	}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		gpu := d.GPULabel()
		ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1,
			gpu, d.UUID, d.Name, d.PCIBusID, snap.DriverVersion, snap.CUDADriverVersion, d.MIGMode, d.ParentUUID)
		if !d.ExportsMemory() {
			continue
		}
		if d.HasMemory {
			m := d.Memory
			ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(m.Total), gpu, d.UUID)
			ch <- prometheus.MustNewConstMetric(c.used, prometheus.GaugeValue, float64(m.Used), gpu, d.UUID)
			ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(m.Free), gpu, d.UUID)
			if m.HasReserved {
				ch <- prometheus.MustNewConstMetric(c.reserved, prometheus.GaugeValue, float64(m.Reserved), gpu, d.UUID)
			}
		}
		if d.HasProcesses {
			ch <- prometheus.MustNewConstMetric(c.processes, prometheus.GaugeValue, float64(len(d.Processes)), gpu, d.UUID)
			if d.HasMemory {
				ch <- prometheus.MustNewConstMetric(c.unattr, prometheus.GaugeValue, float64(d.Unattributed()), gpu, d.UUID)
			}
		}
	}
	return nil
}
