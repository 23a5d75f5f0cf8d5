// Package attribution is the one join of the exporter: NVML's processes on
// each device, the allocator state that processes pushed over the socket,
// and what /proc and Kubernetes say about each pid. Collectors, OOM reports
// and the landing page all read its rows; none of them joins on its own.
package attribution

import (
	"cmp"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/workload"
)

// Row is one process on one device: what NVML lists, what its allocator
// reported, and what the workload cache knows.
type Row struct {
	GPU, UUID string
	PID       uint32
	NVML      *nvmlpoll.Process       // nil when NVML does not list the pid on the device
	Alloc     *allocstats.DeviceStats // nil when the process reports no allocator state here
	Framework string
	Info      workload.Info
	Comm      string // /proc's comm, else the base name of NVML's process name
	// Exited says the process exited and the store keeps it for the OOM
	// linger: Alloc then holds only its counters and last OOM (memory
	// fields zero or absent), so that a scrape sees their last values and
	// nothing counts memory it no longer holds.
	Exited bool
	// start is the exited process's start time, to match its remembered
	// labels.
	start uint64
}

// Context is NVML used minus allocator reserved: the CUDA context and
// every allocation outside the allocator. It is known only where both are
// and used is the larger (a burst between two polls can make NVML's figure
// lag the allocator's).
func (r *Row) Context() (uint64, bool) {
	if r.NVML == nil || !r.NVML.HasUsed || r.Alloc == nil || r.Exited || r.NVML.UsedBytes < r.Alloc.Reserved {
		return 0, false
	}
	return r.NVML.UsedBytes - r.Alloc.Reserved, true
}

// Lookup gives what the workload cache knows about a pid; workload.Resolver
// implements it.
type Lookup interface {
	Lookup(pid uint32) (workload.Info, bool)
}

// Join pairs NVML's processes with the allocator reports by (pid, device)
// and labels each with the workload cache (lookup may be nil). Allocator
// reports are kept when NVML does not list the pid. A report whose process
// start time differs from the live process's is from an earlier holder of
// the pid and is dropped. Rows are sorted by device UUID, then pid.
func Join(snap *nvmlpoll.Snapshot, procs []allocstats.Process, lookup Lookup) []Row {
	type key struct {
		pid  uint32
		uuid string
	}
	type allocRef struct {
		stats     *allocstats.DeviceStats
		framework string
		start     uint64
	}
	listed := 0 // NVML's processes, a bound on the rows with allocs
	if snap != nil {
		for i := range snap.Devices {
			listed += len(snap.Devices[i].Processes)
		}
	}
	reports := 0
	for i := range procs {
		reports += len(procs[i].Devices)
	}
	// Sized once: a scrape joins again each time, and growing these was
	// most of the join's allocations.
	allocs := make(map[key]allocRef, reports)
	exited := make(map[key]allocRef)
	for i := range procs {
		p := &procs[i]
		for j := range p.Devices {
			if !p.Devices[j].HasStats {
				continue // only an oom message so far: no allocator state
			}
			// Key by NVML's spelling: a MIG instance may be reported as
			// GPU-<same hex>.
			uuid := p.Devices[j].UUID
			if d, ok := snap.Device(uuid); ok {
				uuid = d.UUID
			}
			if p.Exited {
				c := countersOnly(p.Devices[j])
				exited[key{p.PID, uuid}] = allocRef{&c, p.Framework, p.StartTime}
				continue
			}
			allocs[key{p.PID, uuid}] = allocRef{&p.Devices[j], p.Framework, p.StartTime}
		}
	}
	for k := range exited {
		if _, ok := allocs[k]; ok {
			delete(exited, k) // a live process of the same pid: it wins
		}
	}
	infos := make(map[uint32]workload.Info, max(listed, len(procs)))
	info := func(pid uint32) workload.Info {
		if in, ok := infos[pid]; ok {
			return in
		}
		in := workload.Info{PID: pid}
		if lookup != nil {
			if got, ok := lookup.Lookup(pid); ok {
				in = got
			}
		}
		infos[pid] = in
		return in
	}
	current := func(pid uint32, a allocRef) bool {
		in := info(pid)
		return a.start == 0 || in.StartTime == 0 || a.start == in.StartTime
	}

	rows := make([]Row, 0, max(listed, len(allocs))+len(exited))
	used := make(map[key]bool, listed)
	if snap != nil {
		for i := range snap.Devices {
			d := &snap.Devices[i]
			if !d.ExportsMemory() {
				continue
			}
			for j := range d.Processes {
				p := &d.Processes[j]
				r := Row{GPU: d.GPULabel(), UUID: d.UUID, PID: p.PID, NVML: p, Info: info(p.PID)}
				r.Comm = r.Info.Comm
				if r.Comm == "" && p.Name != "" {
					r.Comm = path.Base(p.Name)
				}
				k := key{p.PID, d.UUID}
				if a, ok := allocs[k]; ok && current(p.PID, a) {
					r.Alloc, r.Framework = a.stats, a.framework
				} else if a, ok := exited[k]; ok && r.Alloc == nil {
					// NVML still lists a process that /proc says exited
					// (its context is being torn down): one row.
					r.Alloc, r.Framework, r.Exited, r.start = a.stats, a.framework, true, a.start
					delete(exited, k)
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
		r := Row{GPU: d.GPULabel(), UUID: d.UUID, PID: k.pid, Alloc: a.stats, Framework: a.framework, Info: info(k.pid)}
		r.Comm = r.Info.Comm
		rows = append(rows, r)
	}
	for k, a := range exited {
		if used[k] {
			continue
		}
		d, ok := snap.Device(k.uuid)
		if !ok || !d.ExportsMemory() {
			continue
		}
		// /proc and the workload cache no longer know the pid: its labels
		// come from the lookup only if it still answers, else from a
		// Memory (Sources.ReadAt).
		r := Row{GPU: d.GPULabel(), UUID: d.UUID, PID: k.pid, Alloc: a.stats, Framework: a.framework, Exited: true, start: a.start}
		if in := info(k.pid); in.StartTime == a.start {
			r.Info = in
		} else {
			r.Info = workload.Info{PID: k.pid, StartTime: a.start}
		}
		r.Comm = r.Info.Comm
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b Row) int {
		if c := strings.Compare(a.UUID, b.UUID); c != 0 {
			return c
		}
		return cmp.Compare(a.PID, b.PID)
	})
	return rows
}

// countersOnly is what stays of an exited process's device state: its
// counters and last OOM, not the memory it held.
func countersOnly(d allocstats.DeviceStats) allocstats.DeviceStats {
	return allocstats.DeviceStats{
		UUID:           d.UUID,
		HasStats:       d.HasStats,
		AllocRetries:   d.AllocRetries,
		OOMs:           d.OOMs,
		LastOOMRequest: d.LastOOMRequest,
		LastOOMTime:    d.LastOOMTime,
		LastReport:     d.LastReport,
	}
}

// SnapshotSource gives the latest NVML snapshot (nil before the first poll).
type SnapshotSource interface {
	Snapshot() *nvmlpoll.Snapshot
}

// AllocatorSource gives the allocator state pushed by instrumented
// processes.
type AllocatorSource interface {
	Processes() []allocstats.Process
}

// Sources are what the join reads. Any may be nil.
type Sources struct {
	NVML      SnapshotSource
	Allocator AllocatorSource
	Workload  Lookup
	// SettleLabels holds back every row of a pid that Workload does not
	// know yet (a process that appeared since the cache's last refresh), so
	// that a process's labels are settled before its first series: it is
	// never exported with comm="" and then again with its name, which
	// would make two series of one process and restart its counters.
	SettleLabels bool
	// Memory, if set, gives the rows of exited processes the labels they
	// had while they ran, and drops those it never saw run.
	Memory *Memory
}

// View is one consistent reading of the sources: a snapshot and the rows
// joined from it.
type View struct {
	Snapshot *nvmlpoll.Snapshot
	Rows     []Row
}

// Read takes the latest snapshot and allocator state and joins them.
func (s Sources) Read() View {
	var snap *nvmlpoll.Snapshot
	if s.NVML != nil {
		snap = s.NVML.Snapshot()
	}
	return s.ReadAt(snap)
}

// ReadAt joins snap (a snapshot the caller took) with the latest
// allocator state.
func (s Sources) ReadAt(snap *nvmlpoll.Snapshot) View {
	v := View{Snapshot: snap}
	var procs []allocstats.Process
	if s.Allocator != nil {
		procs = s.Allocator.Processes()
	}
	v.Rows = Join(v.Snapshot, procs, s.Workload)
	if s.SettleLabels && s.Workload != nil {
		v.Rows = settled(v.Rows, s.Workload)
	}
	if s.Memory != nil {
		v.Rows = s.Memory.apply(v.Rows)
	}
	return v
}

// settled drops, in place, the rows of pids lookup does not know. Rows of
// exited processes are kept: a Memory labels them.
func settled(rows []Row, lookup Lookup) []Row {
	kept := rows[:0]
	for _, r := range rows {
		if r.Exited {
			kept = append(kept, r)
			continue
		}
		if _, ok := lookup.Lookup(r.PID); ok {
			kept = append(kept, r)
		}
	}
	clear(rows[len(kept):])
	return kept
}

// Device returns the rows of the device uuid (NVML's spelling).
func (v View) Device(uuid string) []Row {
	i := sort.Search(len(v.Rows), func(i int) bool { return v.Rows[i].UUID >= uuid })
	j := i
	for j < len(v.Rows) && v.Rows[j].UUID == uuid {
		j++
	}
	return v.Rows[i:j]
}
