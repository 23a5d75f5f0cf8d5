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

// processRow is one process on one device: what NVML lists, what its
// allocator reported, and what the workload cache knows.
type processRow struct {
	gpu, uuid string
	pid       uint32
	nvml      *nvml.Process           // nil when NVML does not list the pid
	alloc     *allocstats.DeviceStats // nil when the process reports no allocator stats here
	framework string
	info      workload.Info
	comm      string
}

// labels are the per-process labels fixed by the spec.
func (r *processRow) labels() []string {
	return []string{r.gpu, r.uuid, strconv.FormatUint(uint64(r.pid), 10), r.comm, r.info.Namespace, r.info.Pod, r.info.Container}
}

var processLabelNames = []string{"gpu", "uuid", "pid", "comm", "namespace", "pod", "container"}

// joinProcesses pairs NVML's processes with allocator reports by (pid,
// device UUID). Allocator reports are kept when NVML does not list the pid;
// a report whose process start time differs from the live process's is
// from an earlier holder of the pid and is dropped.
func joinProcesses(snap *nvml.Snapshot, procs []allocstats.Process, src Sources) []processRow {
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

	var rows []processRow
	used := make(map[key]bool)
	if snap != nil {
		for i := range snap.Devices {
			d := &snap.Devices[i]
			if !d.ExportsMemory() {
				continue
			}
			for j := range d.Processes {
				p := &d.Processes[j]
				r := processRow{gpu: d.GPULabel(), uuid: d.UUID, pid: p.PID, nvml: p, info: info(p.PID)}
				r.comm = r.info.Comm
				if r.comm == "" {
					r.comm = p.Name
				}
				k := key{p.PID, d.UUID}
				if a, ok := allocs[k]; ok && current(p.PID, a) {
					r.alloc, r.framework = a.stats, a.framework
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
		r := processRow{gpu: d.GPULabel(), uuid: d.UUID, pid: k.pid, alloc: a.stats, framework: a.framework, info: info(k.pid)}
		r.comm = r.info.Comm
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].uuid != rows[j].uuid {
			return rows[i].uuid < rows[j].uuid
		}
		return rows[i].pid < rows[j].pid
	})
	return rows
}

func (s Sources) rows() []processRow {
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
