package collector

import (
	"slices"
	"strings"
	"sync"

	"github.com/alecthomas/kingpin/v2"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// How the process and allocator collectors label their series.
const (
	// AggregatePID exports one series per process and device (the spec's
	// labels, pid and comm included).
	AggregatePID = "pid"
	// AggregatePod exports one series per container and device for
	// processes in a Kubernetes pod, with pid and comm empty, so that
	// process churn inside a pod creates no new series. Processes outside
	// Kubernetes keep their per-process series.
	AggregatePod = "pod"
)

var processAggregation = kingpin.Flag("collector.process.aggregate",
	"Series of the process and allocator collectors: pid (one per process and GPU) or pod (one per container and GPU for processes in a Kubernetes pod, pid and comm empty; for large fleets, see docs/scaling.md).").
	Default(AggregatePID).Enum(AggregatePID, AggregatePod)

// aggregator sums the rows of one container on one device. Sums of
// gauges are sums; the counters (allocator retries and OOMs) must not go
// down when a process leaves the container, so each group keeps the last
// value of every member it has had, and a member's counter that goes down
// (a new process with the same pid) adds its last value to the member's
// base, as the store does for one process's counters.
type aggregator struct {
	mu     sync.Mutex
	groups map[groupKey]*groupState
}

type groupKey struct {
	uuid, namespace, pod, container string
}

type memberKey struct {
	pid   uint32
	start uint64
}

type groupState struct {
	members map[memberKey]*memberCounters
	// retired holds the counters of members folded away to bound the map.
	retired counterSums
}

type memberCounters struct {
	last, base counterSums
}

type counterSums struct {
	retries, ooms       uint64
	hasRetries, hasOOMs bool
}

func (c *counterSums) add(o counterSums) {
	c.retries += o.retries
	c.ooms += o.ooms
	c.hasRetries = c.hasRetries || o.hasRetries
	c.hasOOMs = c.hasOOMs || o.hasOOMs
}

// maxMembers bounds the members a group remembers; beyond it, members that
// left are folded into its retired sums (a member that comes back after
// that is counted again from its next value).
const maxMembers = 256

func newAggregator() *aggregator { return &aggregator{groups: map[groupKey]*groupState{}} }

// aggregate returns rows with the rows of each pod's container on each
// device merged into one, pid and comm empty; rows outside a pod are kept
// as they are. The result is sorted like the join's rows (by UUID, then
// pid, aggregated rows first, by namespace, pod and container). Calling it
// again with the same rows gives the same result.
func (a *aggregator) aggregate(rows []attribution.Row) []attribution.Row {
	a.mu.Lock()
	defer a.mu.Unlock()
	type group struct {
		key     groupKey
		members []*attribution.Row
	}
	var out []attribution.Row
	index := map[groupKey]int{}
	var groups []group
	for i := range rows {
		r := &rows[i]
		if r.Info.Pod == "" {
			out = append(out, *r)
			continue
		}
		k := groupKey{r.UUID, r.Info.Namespace, r.Info.Pod, r.Info.Container}
		j, ok := index[k]
		if !ok {
			j = len(groups)
			index[k] = j
			groups = append(groups, group{key: k})
		}
		groups[j].members = append(groups[j].members, r)
	}
	for _, g := range groups {
		out = append(out, a.merge(g.key, g.members))
	}
	for k := range a.groups {
		if _, ok := index[k]; !ok {
			delete(a.groups, k) // the container left the device: its series go
		}
	}
	slices.SortFunc(out, func(x, y attribution.Row) int {
		if c := strings.Compare(x.UUID, y.UUID); c != 0 {
			return c
		}
		if x.PID != y.PID {
			if x.PID < y.PID {
				return -1
			}
			return 1
		}
		return slices.Compare(
			[]string{x.Info.Namespace, x.Info.Pod, x.Info.Container},
			[]string{y.Info.Namespace, y.Info.Pod, y.Info.Container})
	})
	return out
}

// merge sums one group's members into one row.
func (a *aggregator) merge(k groupKey, members []*attribution.Row) attribution.Row {
	first := members[0]
	r := attribution.Row{
		GPU:  first.GPU,
		UUID: first.UUID,
		Info: first.Info,
	}
	r.Info.PID, r.Info.StartTime, r.Info.Comm, r.Info.Cgroup = 0, 0, "", ""
	r.Framework = first.Framework
	var nv *nvmlpoll.Process
	var al *allocstats.DeviceStats
	state := a.groups[k]
	if state == nil {
		state = &groupState{members: map[memberKey]*memberCounters{}}
		a.groups[k] = state
	}
	var lastOOM *allocstats.DeviceStats
	r.Exited = true // unless a member runs
	for _, m := range members {
		r.Exited = r.Exited && m.Exited
		// The container runs out when its first process does.
		if t := m.TimeToOOM; t.OK && (!r.TimeToOOM.OK || t.V < r.TimeToOOM.V) {
			r.TimeToOOM = t
		}
		for _, f := range []struct{ merged, member *string }{
			{&r.Info.ContainerID, &m.Info.ContainerID}, {&r.Info.PodUID, &m.Info.PodUID},
			{&r.Info.SlurmJobID, &m.Info.SlurmJobID}, {&r.Info.UID, &m.Info.UID}, {&r.Framework, &m.Framework},
		} {
			if *f.merged != *f.member {
				*f.merged = "" // members differ: say nothing rather than one of them
			}
		}
		if m.NVML != nil {
			if nv == nil {
				nv = &nvmlpoll.Process{}
			}
			if m.NVML.HasUsed {
				nv.HasUsed = true
				nv.UsedBytes += m.NVML.UsedBytes
				nv.PeakBytes += m.NVML.PeakBytes
			}
			nv.Compute = nv.Compute || m.NVML.Compute
			nv.Graphics = nv.Graphics || m.NVML.Graphics
		}
		if s := m.Alloc; s != nil {
			if al == nil {
				al = &allocstats.DeviceStats{UUID: k.uuid, HasStats: true}
			}
			al.Reserved += s.Reserved
			for _, o := range []struct{ sum, v *allocstats.Optional }{
				{&al.Active, &s.Active}, {&al.Allocated, &s.Allocated}, {&al.InactiveSplit, &s.InactiveSplit},
				{&al.PeakReserved, &s.PeakReserved}, {&al.PeakActive, &s.PeakActive}, {&al.Limit, &s.Limit},
				{&al.ActiveFloor, &s.ActiveFloor},
			} {
				if o.v.OK {
					o.sum.OK = true
					o.sum.V += o.v.V
				}
			}
			if s.LastReport.After(al.LastReport) {
				al.LastReport = s.LastReport
			}
			if !s.LastOOMTime.IsZero() && (lastOOM == nil || s.LastOOMTime.After(lastOOM.LastOOMTime)) {
				lastOOM = s
			}
			state.observe(memberKey{m.PID, m.Info.StartTime}, s)
		}
	}
	if len(state.members) > maxMembers {
		state.fold(members)
	}
	if al != nil {
		if lastOOM != nil {
			al.LastOOMTime, al.LastOOMRequest = lastOOM.LastOOMTime, lastOOM.LastOOMRequest
		}
		total := state.total()
		al.AllocRetries = allocstats.Optional{V: total.retries, OK: total.hasRetries}
		al.OOMs = allocstats.Optional{V: total.ooms, OK: total.hasOOMs}
	}
	r.NVML, r.Alloc = nv, al
	return r
}

// observe records a member's counters.
func (g *groupState) observe(k memberKey, s *allocstats.DeviceStats) {
	now := counterSums{
		retries: s.AllocRetries.V, hasRetries: s.AllocRetries.OK,
		ooms: s.OOMs.V, hasOOMs: s.OOMs.OK,
	}
	m := g.members[k]
	if m == nil {
		m = &memberCounters{}
		g.members[k] = m
	}
	if now.retries < m.last.retries {
		m.base.retries += m.last.retries
	}
	if now.ooms < m.last.ooms {
		m.base.ooms += m.last.ooms
	}
	m.last.retries, m.last.ooms = now.retries, now.ooms
	m.last.hasRetries = m.last.hasRetries || now.hasRetries
	m.last.hasOOMs = m.last.hasOOMs || now.hasOOMs
}

// fold moves the counters of members that left (not in present) into
// the retired sums.
func (g *groupState) fold(present []*attribution.Row) {
	keep := make(map[memberKey]bool, len(present))
	for _, m := range present {
		keep[memberKey{m.PID, m.Info.StartTime}] = true
	}
	for k, m := range g.members {
		if !keep[k] {
			g.retired.add(m.last)
			g.retired.add(m.base)
			delete(g.members, k)
		}
	}
}

// total is the group's counters: every member's, present or gone.
func (g *groupState) total() counterSums {
	t := g.retired
	for _, m := range g.members {
		t.add(m.last)
		t.add(m.base)
	}
	return t
}
