package collector

import (
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

func init() {
	registerCollector("gpu", true, newGPUCollector)
}

var (
	gpuSchema     = newSchema("gpu", "uuid")
	gpuInfoSchema = newSchema("gpu", "uuid", "name", "pci_bus_id", "driver_version", "cuda_driver_version", "mig_mode", "parent_uuid")
)

type gpuCollector struct {
	info                                *family
	total, used, free, reserved, unattr *family
	processes                           *family
}

func newGPUCollector(_ Sources, _ log.Logger) (Collector, error) {
	d := func(name, help string) *family {
		return newFamily(prometheus.BuildFQName(namespace, "gpu", name), help, prometheus.GaugeValue, gpuSchema)
	}
	return &gpuCollector{
		info: newFamily(prometheus.BuildFQName(namespace, "gpu", "info"), "GPU or MIG instance identity; parent_uuid names the GPU a MIG instance belongs to.",
			prometheus.GaugeValue, gpuInfoSchema),
		total:     d("memory_total_bytes", "Total device memory (NVML)."),
		used:      d("memory_used_bytes", "Device memory used (NVML v2: excludes the driver's reservation)."),
		free:      d("memory_free_bytes", "Device memory free (NVML)."),
		reserved:  d("memory_reserved_bytes", "Device memory the driver and firmware reserve (NVML v2 only)."),
		unattr:    d("memory_unattributed_bytes", "Used memory not accounted for by any listed process (never below 0)."),
		processes: d("processes", "Processes holding a context on the device."),
	}, nil
}

func (c *gpuCollector) Update(sc *Scrape, ch chan<- prometheus.Metric) error {
	return updateRows(c, sc, ch)
}

// rows are the devices of the snapshot: identity for each, memory for
// those that export it (not a GPU in MIG mode, whose instances do).
func (c *gpuCollector) rows(sc *Scrape) (*rowSet, error) {
	snap := sc.View().Snapshot
	if snap == nil || len(snap.Devices) == 0 {
		return nil, ErrNoData
	}
	devs := snap.Devices
	mem := func(f func(d *nvmlpoll.Device) (uint64, bool)) func(i int) (float64, bool) {
		return func(i int) (float64, bool) {
			d := &devs[i]
			if !d.ExportsMemory() {
				return 0, false
			}
			v, ok := f(d)
			return float64(v), ok
		}
	}
	return &rowSet{
		n: len(devs),
		labels: func(i int, s *schema) []string {
			d := &devs[i]
			if s == gpuSchema {
				return []string{d.GPULabel(), d.UUID}
			}
			return []string{d.GPULabel(), d.UUID, d.Name, d.PCIBusID, snap.DriverVersion, snap.CUDADriverVersion, d.MIGMode, d.ParentUUID}
		},
		columns: []column{
			{c.info, func(int) (float64, bool) { return 1, true }},
			{c.total, mem(func(d *nvmlpoll.Device) (uint64, bool) { return d.Memory.Total, d.HasMemory })},
			{c.used, mem(func(d *nvmlpoll.Device) (uint64, bool) { return d.Memory.Used, d.HasMemory })},
			{c.free, mem(func(d *nvmlpoll.Device) (uint64, bool) { return d.Memory.Free, d.HasMemory })},
			{c.reserved, mem(func(d *nvmlpoll.Device) (uint64, bool) { return d.Memory.Reserved, d.HasMemory && d.Memory.HasReserved })},
			{c.processes, mem(func(d *nvmlpoll.Device) (uint64, bool) { return uint64(len(d.Processes)), d.HasProcesses })},
			{c.unattr, mem(func(d *nvmlpoll.Device) (uint64, bool) { return d.Unattributed(), d.HasProcesses && d.HasMemory })},
		},
	}, nil
}
