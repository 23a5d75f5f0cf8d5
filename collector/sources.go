package collector

import (
	"github.com/gpumem/gpumem_exporter/nvml"
	"github.com/gpumem/gpumem_exporter/workload"
	"github.com/prometheus/client_golang/prometheus"
)

// SnapshotSource gives the latest NVML snapshot (nil before the first poll).
type SnapshotSource interface {
	Snapshot() *nvml.Snapshot
}

// Sources are what collectors read. Any may be nil where a collector does
// not need it; workload lookups fall back to NVML's process name.
type Sources struct {
	NVML SnapshotSource
	// NVMLHealth exports gpumem_nvml_up, poll durations and call errors.
	NVMLHealth prometheus.Collector
	Allocator  AllocatorSource
	Workload   workload.Resolver
}

func (s Sources) lookup(pid uint32) workload.Info {
	if s.Workload != nil {
		if info, ok := s.Workload.Lookup(pid); ok {
			return info
		}
	}
	return workload.Info{PID: pid}
}
