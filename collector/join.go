package collector

import (
	"sort"
	"strconv"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/nvml"
	"github.com/gpumem/gpumem_exporter/workload"
)

// AllocatorSource gives the allocator state pushed by instrumented
// processes.
type AllocatorSource interface {
	Processes() []allocstats.Process
}

// Holding is one process on one device: what NVML lists, what its
// allocator reported, and what the workload cache knows. The collectors and
// the landing page read the same join.
type Holding struct {
	GPU, UUID string
	PID       uint32
	NVML      *nvml.Process           // nil when NVML does not list the pid on the device
	Alloc     *allocstats.DeviceStats // nil when the process reports no allocator state here
	Framework string
	Info      workload.Info
	Comm      string // /proc's comm, else NVML's process name
}

// Context is NVML used minus allocator reserved, where both are known and
// used is the larger.
func (h *Holding) Context() (uint64, bool) {
	if h.NVML == nil || !h.NVML.HasUsed || h.Alloc == nil || h.NVML.UsedBytes < h.Alloc.Reserved {
		return 0, false
	}
	return h.NVML.UsedBytes - h.Alloc.Reserved, true
}

// labels are the per-process labels fixed by the spec.
func (r *Holding) labels() []string {
	return []string{r.GPU, r.UUID, strconv.FormatUint(uint64(r.PID), 10), r.Comm, r.Info.Namespace, r.Info.Pod, r.Info.Container}
}

var processLabelNames = []string{"gpu", "uuid", "pid", "comm", "namespace", "pod", "container"}

// joinProcesses pairs NVML's processes with allocator reports by (pid,
// device UUID). Allocator reports are kept when NVML does not list the pid;
// a report whose process start time differs from the live process's is
// from an earlier holder of the pid and is dropped.
func joinProcesses(snap *nvml.Snapshot, procs []allocstats.Process, src Sources) []Holding {
	type key struct {
		pid  uint32
		uuid string
	}
	type allocRef struct {
		stats     *allocstats.DeviceStats
		framework string
		start     uint64
	}
	allocs := make(map[key]allocRef)
	for i := range procs {
		p := &procs[i]
		for j := range p.Devices {
			if !p.Devices[j].HasStats {
				continue // only an oom message so far: no allocator state to export
			}
			// Key by NVML's spelling: a MIG instance may be reported as
			// GPU-<same hex>.
			uuid := p.Devices[j].UUID
			if d, ok := snap.Device(uuid); ok {
				uuid = d.UUID
			}
			allocs[key{p.PID, uuid}] = allocRef{&p.Devices[j], p.Framework, p.StartTime}
		}
	}
	infos := make(map[uint32]workload.Info)
	info := func(pid uint32) workload.Info {
		if in, ok := infos[pid]; ok {
			return in
		}
		in := src.lookup(pid)
		infos[pid] = in
		return in
	}
	current := func(pid uint32, a allocRef) bool {
		in := info(pid)
		return a.start == 0 || in.StartTime == 0 || a.start == in.StartTime
	}

	var rows []Holding
	used := make(map[key]bool)
	if snap != nil {
		for i := range snap.Devices {
			d := &snap.Devices[i]
			if !d.ExportsMemory() {
				continue
			}
			for j := range d.Processes {
				p := &d.Processes[j]
				r := Holding{GPU: d.GPULabel(), UUID: d.UUID, PID: p.PID, NVML: p, Info: info(p.PID)}
				r.Comm = r.Info.Comm
				if r.Comm == "" {
					r.Comm = p.Name
				}
				k := key{p.PID, d.UUID}
				if a, ok := allocs[k]; ok && current(p.PID, a) {
					r.Alloc, r.Framework = a.stats, a.framework
				}
				used[k] = true
				rows = append(rows, r)
			}
		}
	}
	for k, a := range allocs {
		if used[k] || !current(k.pid, a) {
			continue
		}
		d, ok := snap.Device(k.uuid)
		if !ok || !d.ExportsMemory() {
			continue // the device is gone, or a MIG parent whose instances carry the memory
		}
		r := Holding{GPU: d.GPULabel(), UUID: d.UUID, PID: k.pid, Alloc: a.stats, Framework: a.framework, Info: info(k.pid)}
		r.Comm = r.Info.Comm
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].UUID != rows[j].UUID {
			return rows[i].UUID < rows[j].UUID
		}
		return rows[i].PID < rows[j].PID
	})
	return rows
}

// Join pairs NVML's processes with the allocator reports and the workload
// cache (which may be nil), as the collectors do on each scrape.
func Join(snap *nvml.Snapshot, procs []allocstats.Process, resolver workload.Resolver) []Holding {
	return joinProcesses(snap, procs, Sources{Workload: resolver})
}

func (s Sources) rows() []Holding {
	var snap *nvml.Snapshot
	if s.NVML != nil {
		snap = s.NVML.Snapshot()
	}
	var procs []allocstats.Process
	if s.Allocator != nil {
		procs = s.Allocator.Processes()
	}
	return joinProcesses(snap, procs, s)
}
