package simulate

import (
	"fmt"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
	"github.com/gpumem/gpumem_exporter/workload"
)

// scenarioScript runs one of simulate/scenario's timelines.
type scenarioScript struct {
	node *scenario.Node
}

// ticksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's start time.
const ticksPerSecond = 100

func (s *scenarioScript) maxProcesses() int { return s.node.MaxProcesses() }

func (s *scenarioScript) step(dt time.Duration) state {
	t := s.node.Advance(dt)
	var st state
	for _, g := range t.GPUs {
		if g.Index >= 0 && g.Index < len(st.gpuUsed) {
			st.gpuUsed[g.Index] = g.Used
		}
	}
	for _, p := range t.Processes {
		st.processes = append(st.processes, fromScenario(p))
	}
	for _, p := range t.Exited {
		st.exited = append(st.exited, pidBase+p.PID)
		st.final = append(st.final, fromScenario(p))
	}
	for _, o := range t.OOMs {
		at := fromScenario(o.AtFailure)
		st.ooms = append(st.ooms, oomEvent{
			pid: at.pid, gpu: o.GPU, start: at.start, uid: at.uid,
			requested: o.Requested, limit: o.Limit, free: o.Free,
			report: at.report, ago: t.Elapsed - o.At,
		})
	}
	return st
}

// startTicks is a simulated process's start time: never 0 (unknown), and
// different for each life of a pid.
func startTicks(pid int, started time.Duration) uint64 {
	return uint64(started/(time.Second/ticksPerSecond)) + uint64(pid)%1000 + 1
}

func fromScenario(p scenario.Process) process {
	pid := pidBase + p.PID
	out := process{
		pid:   pid,
		gpu:   p.GPU,
		start: startTicks(p.PID, p.Started),
		uid:   uidBase + uint32(p.PID),
		used:  p.Used(),
		info: workload.Info{
			PID: uint32(pid), Comm: p.Comm, Namespace: p.Namespace, Pod: p.Pod, Container: p.Container,
			SlurmJobID: p.SlurmJobID,
		},
	}
	out.info.StartTime = out.start
	if p.Pod != "" {
		out.info.PodUID = fmt.Sprintf("00000000-0000-4000-8000-%012x", hash(p.Namespace+"/"+p.Pod))
	}
	if !p.ReportsAllocator {
		return out
	}
	r := allocstats.DeviceReport{
		UUID:          UUIDs[p.GPU],
		Reserved:      p.Reserved,
		Active:        allocstats.Some(p.Active),
		Allocated:     allocstats.Some(p.Allocated),
		InactiveSplit: allocstats.Some(p.InactiveSplit),
		PeakReserved:  allocstats.Some(p.PeakReserved),
		PeakActive:    allocstats.Some(p.PeakActive),
		AllocRetries:  allocstats.Some(p.AllocRetries),
		OOMs:          allocstats.Some(p.OOMs),
	}
	if p.Limit > 0 {
		r.Limit = allocstats.Some(p.Limit)
	}
	out.report = &r
	return out
}

// hash is FNV-1a, for stable fake pod UIDs.
func hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h & 0xffffffffffff
}
