package simulate

import (
	"math/rand"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/workload"
)

// Figures of the Load scenario.
const (
	// loadUnattributedGPU is the GPU on which memory is used by no listed
	// process (another PID namespace, MPS), and how much.
	loadUnattributedGPU   = 3
	loadUnattributedBytes = 3 * GiB
	// loadOOMGPU's first slot runs under a per-process limit and hits it.
	loadOOMGPU        = 5
	loadOOMLimitBytes = 40 * GiB
)

// loadScript is the Load scenario: on every GPU, perGPU slots whose
// processes start, grow, spike, release memory, empty their cache and
// exit, each slot on its own deterministic schedule. One step per call,
// whatever the time.
type loadScript struct {
	gpus [8][]*simSlot
}

func newLoadScript(perGPU int, seed int64) *loadScript {
	if perGPU <= 0 {
		perGPU = 3
	}
	s := &loadScript{}
	for i := range s.gpus {
		for j := 0; j < perGPU; j++ {
			sl := &simSlot{
				gpu:  i,
				slot: j,
				rng:  rand.New(rand.NewSource(seed*1000003 + int64(i*1000+j))),
				// The last slot of even GPUs is a process that pushes no
				// allocator stats (an inference server, a C++ job).
				reporting: !(j == perGPU-1 && i%2 == 0 && perGPU > 1),
			}
			sl.comm = "python3"
			if !sl.reporting {
				sl.comm = "tritonserver"
			}
			if i == loadOOMGPU && j == 0 {
				sl.limit = loadOOMLimitBytes
			}
			// Stagger the slots so that the node is busy from the start.
			sl.waitingUntilRestarts = j * 3
			s.gpus[i] = append(s.gpus[i], sl)
		}
	}
	return s
}

func (s *loadScript) maxProcesses() int {
	n := 0
	for _, slots := range s.gpus {
		n += len(slots)
	}
	return n
}

func (s *loadScript) step(time.Duration) state {
	var st state
	for i, slots := range s.gpus {
		for _, sl := range slots {
			sl.step()
			if sl.exitedPID != 0 {
				st.exited = append(st.exited, int(sl.exitedPID))
			}
			if sl.alive {
				st.gpuUsed[i] += sl.used()
			}
		}
		if i == loadUnattributedGPU {
			st.gpuUsed[i] += loadUnattributedBytes
		}
	}
	for i, slots := range s.gpus {
		for _, sl := range slots {
			if sl.oomThisStep != nil {
				o := *sl.oomThisStep
				o.free = TotalBytes - DriverReserve - st.gpuUsed[i]
				// The slot holds its state at the failure for the step.
				r := sl.report()
				o.report = &r
				st.ooms = append(st.ooms, o)
			}
			if !sl.alive {
				continue
			}
			p := process{pid: int(sl.pid), gpu: i, start: uint64(sl.pid), uid: sl.uid(), used: sl.used(),
				info: workload.Info{PID: sl.pid, StartTime: uint64(sl.pid), Comm: sl.comm}}
			if sl.reporting {
				r := sl.report()
				p.report = &r
			}
			st.processes = append(st.processes, p)
		}
	}
	return st
}

type simSlot struct {
	gpu, slot  int
	rng        *rand.Rand
	reporting  bool
	comm       string
	limit      uint64
	generation int
	// schedule of the current life
	alive                bool
	age, life, gap       int
	target, spike        uint64
	pid                  uint32
	reserved, active     uint64
	split                uint64
	peakRes, peakAct     uint64
	retries, ooms        uint64
	oomThisStep          *oomEvent
	exitedPID            uint32
	waitingUntilRestarts int
}

func (sl *simSlot) used() uint64 { return ContextBytes + sl.reserved }

// uid is the slot's: every process the slot runs reports under it, so
// that over a process cap of the store a slot's new process pushes its own
// predecessor out of the linger, not another slot's.
func (sl *simSlot) uid() uint32 { return uidBase + uint32(sl.gpu*100+sl.slot) }

func (sl *simSlot) report() allocstats.DeviceReport {
	r := allocstats.DeviceReport{
		UUID:          UUIDs[sl.gpu],
		Reserved:      sl.reserved,
		Active:        allocstats.Some(sl.active),
		Allocated:     allocstats.Some(sl.active - min(sl.active, 2*MiB)),
		InactiveSplit: allocstats.Some(sl.split),
		PeakReserved:  allocstats.Some(sl.peakRes),
		PeakActive:    allocstats.Some(sl.peakAct),
		AllocRetries:  allocstats.Some(sl.retries),
		OOMs:          allocstats.Some(sl.ooms),
	}
	if sl.limit > 0 {
		r.Limit = allocstats.Some(sl.limit)
	}
	return r
}

// roundSegment rounds up to PyTorch's 2 MiB segment granularity.
func roundSegment(b uint64) uint64 { return (b + 2*MiB - 1) / (2 * MiB) * (2 * MiB) }

func (sl *simSlot) step() {
	sl.exitedPID = 0
	sl.oomThisStep = nil
	if !sl.alive {
		if sl.waitingUntilRestarts > 0 {
			sl.waitingUntilRestarts--
			return
		}
		sl.start()
		return
	}
	sl.age++
	if sl.age >= sl.life {
		sl.alive = false
		sl.exitedPID = sl.pid
		sl.reserved, sl.active, sl.split = 0, 0, 0
		sl.waitingUntilRestarts = sl.gap
		return
	}
	growEnd := sl.life * 4 / 10
	releaseAt := sl.life * 7 / 10
	emptyAt := sl.life * 85 / 100
	switch {
	case sl.age < growEnd:
		sl.reserved = roundSegment(sl.target * uint64(sl.age+1) / uint64(growEnd))
		sl.active = roundSegment(sl.reserved * 9 / 10)
		sl.split = 0
	case sl.age < growEnd+2:
		want := sl.target + sl.spike
		if sl.limit > 0 && want > sl.limit {
			if sl.age == growEnd {
				// The allocator flushes its cache, retries, and gives up.
				sl.retries++
				sl.ooms++
				sl.oomThisStep = &oomEvent{pid: int(sl.pid), gpu: sl.gpu, start: uint64(sl.pid), uid: sl.uid(), requested: sl.spike, limit: sl.limit}
			}
			sl.active = sl.target
			sl.reserved = sl.target
		} else {
			sl.reserved = want
			sl.active = want
		}
	case sl.age < releaseAt:
		sl.active = roundSegment(sl.target * 9 / 10)
	case sl.age < emptyAt:
		sl.active = roundSegment(sl.target / 4)
		sl.split = roundSegment((sl.reserved - sl.active) / 10)
	default:
		sl.reserved = roundSegment(sl.active + sl.split)
	}
	sl.peakRes = max(sl.peakRes, sl.reserved)
	sl.peakAct = max(sl.peakAct, sl.active)
}

func (sl *simSlot) start() {
	sl.generation++
	sl.alive = true
	sl.age = 0
	sl.life = 40 + sl.rng.Intn(60)
	sl.gap = 2 + sl.rng.Intn(6)
	sl.target = uint64(4+sl.rng.Intn(36)) * GiB
	sl.spike = uint64(4+sl.rng.Intn(8)) * GiB
	if sl.limit > 0 {
		sl.target = sl.limit - 6*GiB
		sl.spike = 8 * GiB
	}
	sl.pid = uint32(pidBase + sl.gpu*10000 + sl.slot*100 + sl.generation%100)
	sl.reserved = 20 * MiB
	sl.active = 0
	sl.split = 0
	sl.peakRes, sl.peakAct = sl.reserved, 0
	sl.retries, sl.ooms = 0, 0
}
