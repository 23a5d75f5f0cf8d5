// Package attribution is the one join of the exporter: NVML's processes on
// each device, the allocator state that processes pushed over the socket,
// and what /proc and Kubernetes say about each pid. Collectors, OOM reports,
// the forecasts and the landing page all read its rows; none of them joins
// on its own, and a row becomes what package diagnosis reads in one place
// (diagnosis.go).
package attribution

import (
	"cmp"
	"path"
	"slices"
	"sort"
	"strconv"
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
	// TimeToOOM is what the daemon foresees (Sources.Forecasts): the
	// seconds until the process runs out of memory at its current climb,
	// absent while no climb is measured.
	TimeToOOM allocstats.Optional
	// start is the start time of the process whose allocator state the
	// row holds (0 if unknown), to match its remembered labels.
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

// AllocStart is the start time of the process whose allocator state the
// row holds (0 if unknown): with PID and UUID, the key of its trend.
func (r *Row) AllocStart() uint64 { return r.start }

// Workload names what the process belongs to, as the workload label says
// it: its pod ("namespace/pod"), else its Slurm job ("slurm job 4242"),
// else the process itself on node ("node-a pid 1234"; "pid 1234" where
// node is empty). Alerts and dashboards group by it, so that the ranks of
// one job raise one alert.
func (r *Row) Workload(node string) string {
	switch {
	case r.Info.Pod != "":
		return r.Info.Namespace + "/" + r.Info.Pod
	case r.Info.SlurmJobID != "":
		return "slurm job " + r.Info.SlurmJobID
	}
	pid := "pid " + strconv.FormatUint(uint64(r.PID), 10)
	if node == "" {
		return pid
	}
	return node + " " + pid
}

// Capacity is what the process's allocator can reserve at most: what it
// reserves plus free (the device's free memory), or its limit where that is
// smaller. Known for a running process that reports its reserved memory,
// and where free is known or a limit set.
func (r *Row) Capacity(free uint64, freeKnown bool) (uint64, bool) {
	if r.Alloc == nil || r.Exited {
		return 0, false
	}
	limit := r.Alloc.Limit
	hasLimit := limit.OK && limit.V > 0
	switch {
	case freeKnown && hasLimit:
		return min(limit.V, r.Alloc.Reserved+free), true
	case freeKnown:
		return r.Alloc.Reserved + free, true
	case hasLimit:
		return limit.V, true
	}
	return 0, false
}

// Lookup gives what the workload cache knows about a pid;
// workload.ProcResolver and the other workload.Trackers implement it.
type Lookup interface {
	Lookup(pid uint32) (workload.Info, bool)
}

// Join pairs NVML's processes with the allocator reports by (pid, device)
// and labels each with the workload cache (lookup may be nil). Allocator
// reports are kept when NVML does not list the pid. A report whose process
// start time differs from the live process's is from an earlier holder of
// the pid and is dropped. A process that exited keeps its own row, apart
// from a live process of the same pid (Sources.ReadAt settles which of
// them a scrape shows). Rows are sorted by device UUID, then pid; rows of
// one pid and device keep the order of procs.
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
	type exitedRef struct {
		key
		allocRef
		used bool
	}
	var exited []exitedRef // in the order of procs: the first to exit first
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
				exited = append(exited, exitedRef{key: key{p.PID, uuid}, allocRef: allocRef{&c, p.Framework, p.StartTime}})
				continue
			}
			allocs[key{p.PID, uuid}] = allocRef{&p.Devices[j], p.Framework, p.StartTime}
		}
	}
	sameProcess := func(a, b uint64) bool { return a == 0 || b == 0 || a == b }
	for i := range exited {
		if a, ok := allocs[exited[i].key]; ok && sameProcess(a.start, exited[i].start) {
			exited[i].used = true // the same process reports again: it wins
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
					r.Alloc, r.Framework, r.start = a.stats, a.framework, a.start
				} else {
					for i := range exited {
						x := &exited[i]
						if x.used || x.key != k || !sameProcess(r.Info.StartTime, x.start) {
							continue
						}
						// NVML still lists a process that /proc says
						// exited (its context is being torn down): one row.
						r.Alloc, r.Framework, r.Exited, r.start = x.stats, x.framework, true, x.start
						x.used = true
						break
					}
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
		r := Row{GPU: d.GPULabel(), UUID: d.UUID, PID: k.pid, Alloc: a.stats, Framework: a.framework, Info: info(k.pid), start: a.start}
		r.Comm = r.Info.Comm
		rows = append(rows, r)
	}
	for _, x := range exited {
		if x.used {
			continue
		}
		k, a := x.key, x.allocRef
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
	slices.SortStableFunc(rows, func(a, b Row) int {
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
	// Node is this node's name, in the workload of a process outside pods
	// and Slurm jobs (Row.Workload).
	Node string
	// Forecasts, if set, gives each running process's time to OOM
	// (Row.TimeToOOM).
	Forecasts Forecasts
}

// Forecasts says what the daemon foresees of a process on a device: the
// whole seconds until it runs out of memory at its current climb, ok
// false while no climb is measured. foresight.Forecaster implements it.
type Forecasts interface {
	TimeToOOM(pid uint32, start uint64, uuid string) (seconds uint64, ok bool)
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
	v.Rows = oneProcessPerSlot(v.Rows)
	if s.Forecasts != nil {
		for i := range v.Rows {
			r := &v.Rows[i]
			if r.Alloc == nil || r.Exited {
				continue
			}
			if secs, ok := s.Forecasts.TimeToOOM(r.PID, r.start, r.UUID); ok {
				r.TimeToOOM = allocstats.Some(secs)
			}
		}
	}
	return v
}

// oneProcessPerSlot settles the rows that share a pid and device: a
// process that exited and lingers beside a live process given the same
// pid, or two that exited. Their series would carry the same pid and
// could carry the same labels, so the first of them to exit keeps the
// slot's allocator series (its counters, last OOM and process_info) for
// its linger, and a new holder of the pid can neither reset nor take them
// over: the others' allocator state is held back until that linger ends.
// A live process keeps its NVML series beside the lingering row, in the
// same row when every label is the same. Rows are sorted as Join sorts
// them.
func oneProcessPerSlot(rows []Row) []Row {
	shared := false
	for i := 1; i < len(rows) && !shared; i++ {
		shared = rows[i].PID == rows[i-1].PID && rows[i].UUID == rows[i-1].UUID
	}
	if !shared {
		return rows
	}
	out := make([]Row, 0, len(rows))
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].PID == rows[i].PID && rows[j].UUID == rows[i].UUID {
			j++
		}
		out = append(out, settleSlot(rows[i:j])...)
		i = j
	}
	return out
}

// settleSlot is oneProcessPerSlot for the rows of one pid and device, in
// the order Join gives them (exited ones in the order they exited).
func settleSlot(slot []Row) []Row {
	first := -1
	for i := range slot {
		if slot[i].Exited {
			first = i
			break
		}
	}
	if len(slot) == 1 || first < 0 {
		return slot
	}
	lingering := slot[first]
	out := make([]Row, 0, 2)
	for _, r := range slot {
		if r.Exited {
			continue
		}
		r.Alloc, r.start = nil, 0
		switch {
		case r.NVML == nil:
		case lingering.NVML == nil && sameLabels(&r, &lingering):
			lingering.NVML = r.NVML
		default:
			out = append(out, r)
		}
	}
	return append(out, lingering)
}

// sameLabels reports whether two rows of one pid and device would carry
// the same labels on every per-process series.
func sameLabels(a, b *Row) bool {
	x, y := a.Info, b.Info
	return a.Comm == b.Comm && a.Framework == b.Framework && x.Namespace == y.Namespace && x.Pod == y.Pod &&
		x.Container == y.Container && x.ContainerID == y.ContainerID && x.PodUID == y.PodUID &&
		x.SlurmJobID == y.SlurmJobID && x.UID == y.UID
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
