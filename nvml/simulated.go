package nvml

import (
	"fmt"
	"math/rand"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Figures of the simulated node, taken from a real H200 (GPU-FACTS.md).
const (
	MiB = 1 << 20
	GiB = 1 << 30

	SimTotalBytes    = 150754820096 // 143771 MiB
	SimDriverReserve = 644939776    // NVML v2 reserved at idle
	SimContextBytes  = 520 * MiB    // PyTorch's CUDA context on an H200
	// SimUnattributedGPU is the GPU on which memory is used by no listed
	// process (another PID namespace, MPS), and how much.
	SimUnattributedGPU   = 3
	SimUnattributedBytes = 3 * GiB
	// SimOOMGPU's first slot runs under a per-process limit and hits it.
	SimOOMGPU        = 5
	SimOOMLimitBytes = 40 * GiB
	simPIDBase       = 4100000
)

// SimUUIDs are the pinned UUIDs of the simulated node's eight GPUs.
var SimUUIDs = [8]string{
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000000",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000001",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000002",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000003",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000004",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000005",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000007",
}

// SimAllocator is the allocator state of one simulated process on its GPU,
// as a client would push it.
type SimAllocator struct {
	PID           uint32
	UUID          string
	Reserved      uint64
	Active        uint64
	Allocated     uint64
	InactiveSplit uint64
	PeakReserved  uint64
	PeakActive    uint64
	Limit         uint64 // 0: no limit
	AllocRetries  uint64
	OOMs          uint64
}

// SimOOM is an out-of-memory event of a simulated process.
type SimOOM struct {
	PID       uint32
	UUID      string
	Requested uint64
	Limit     uint64
	Free      uint64
}

// SimStep is what one step of the script changed, for the allocator feed.
type SimStep struct {
	Allocators []SimAllocator // every reporting process alive after the step
	Exited     []uint32       // pids that exited in this step
	OOMs       []SimOOM
}

// SimConfig configures the simulated node.
type SimConfig struct {
	ProcessesPerGPU int
	Seed            int64
	// OnStep receives the allocator state after each step.
	OnStep func(SimStep)
}

// Simulator is a scripted 8-GPU H200 node on go-nvml's dgxh200 mock:
// processes start, grow, spike, release memory, empty their cache and exit,
// each slot on its own deterministic schedule.
type Simulator struct {
	cfg    SimConfig
	server *server.Server

	mu   sync.Mutex
	gpus [8]*simGPU
}

type simGPU struct {
	index int
	slots []*simSlot
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
	oomThisStep          *SimOOM
	exitedPID            uint32
	waitingUntilRestarts int
}

// NewSimulator builds the node. Call Step to advance its script (the poller
// does before each poll).
func NewSimulator(cfg SimConfig) *Simulator {
	if cfg.ProcessesPerGPU <= 0 {
		cfg.ProcessesPerGPU = 3
	}
	s := &Simulator{cfg: cfg, server: dgxh200.New()}
	s.server.DriverVersion = "580.159.04"
	s.server.NvmlVersion = "13.580.159.04"
	s.server.CudaDriverVersion = 13000
	for i := range s.gpus {
		g := &simGPU{index: i}
		for j := 0; j < cfg.ProcessesPerGPU; j++ {
			sl := &simSlot{
				gpu:  i,
				slot: j,
				rng:  rand.New(rand.NewSource(cfg.Seed*1000003 + int64(i*1000+j))),
				// The last slot of even GPUs is a process that pushes no
				// allocator stats (an inference server, a C++ job).
				reporting: !(j == cfg.ProcessesPerGPU-1 && i%2 == 0 && cfg.ProcessesPerGPU > 1),
			}
			sl.comm = "python3"
			if !sl.reporting {
				sl.comm = "tritonserver"
			}
			if i == SimOOMGPU && j == 0 {
				sl.limit = SimOOMLimitBytes
			}
			// Stagger the slots so that the node is busy from the start.
			sl.waitingUntilRestarts = j * 3
			g.slots = append(g.slots, sl)
		}
		s.gpus[i] = g
		s.wireDevice(i)
	}
	s.wireServer()
	return s
}

// Interface returns the simulated NVML library.
func (s *Simulator) Interface() gonvml.Interface { return s.server }

func (s *Simulator) wireServer() {
	s.server.SystemGetProcessNameFunc = func(pid int) (string, gonvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, g := range s.gpus {
			for _, sl := range g.slots {
				if sl.alive && int(sl.pid) == pid {
					return sl.comm, gonvml.SUCCESS
				}
			}
		}
		return "", gonvml.ERROR_NOT_FOUND
	}
}

func (s *Simulator) wireDevice(i int) {
	d := s.server.Devices[i].(*server.Device)
	d.UUID = SimUUIDs[i]
	d.Config.Name = "NVIDIA H200"
	d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
		var p gonvml.PciInfo
		id := fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
		for k := 0; k < len(id) && k < len(p.BusId)-1; k++ {
			p.BusId[k] = int8(id[k])
		}
		p.Bus = uint32(0x18 + i*0x10)
		return p, gonvml.SUCCESS
	}
	d.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		used := s.gpuUsed(i)
		return gonvml.Memory_v2{Version: 2, Total: SimTotalBytes, Reserved: SimDriverReserve, Used: used, Free: SimTotalBytes - SimDriverReserve - used}, gonvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		used := s.gpuUsed(i) + SimDriverReserve
		return gonvml.Memory{Total: SimTotalBytes, Used: used, Free: SimTotalBytes - used}, gonvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []gonvml.ProcessInfo
		for _, sl := range s.gpus[i].slots {
			if sl.alive {
				out = append(out, gonvml.ProcessInfo{Pid: sl.pid, UsedGpuMemory: sl.used(), GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
			}
		}
		return out, gonvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return nil, gonvml.SUCCESS
	}
}

// gpuUsed is called with s.mu held.
func (s *Simulator) gpuUsed(i int) uint64 {
	var used uint64
	for _, sl := range s.gpus[i].slots {
		if sl.alive {
			used += sl.used()
		}
	}
	if i == SimUnattributedGPU {
		used += SimUnattributedBytes
	}
	return used
}

func (sl *simSlot) used() uint64 { return SimContextBytes + sl.reserved }

// Step advances the script by one tick and hands the allocator state to
// OnStep.
func (s *Simulator) Step() {
	s.mu.Lock()
	var step SimStep
	for _, g := range s.gpus {
		for _, sl := range g.slots {
			sl.step()
			if sl.exitedPID != 0 {
				step.Exited = append(step.Exited, sl.exitedPID)
			}
			if sl.oomThisStep != nil {
				oom := *sl.oomThisStep
				oom.Free = SimTotalBytes - SimDriverReserve - s.gpuUsed(g.index)
				step.OOMs = append(step.OOMs, oom)
			}
			if sl.alive && sl.reporting {
				step.Allocators = append(step.Allocators, sl.allocator())
			}
		}
	}
	s.mu.Unlock()
	if s.cfg.OnStep != nil {
		s.cfg.OnStep(step)
	}
}

func (sl *simSlot) allocator() SimAllocator {
	return SimAllocator{
		PID:           sl.pid,
		UUID:          SimUUIDs[sl.gpu],
		Reserved:      sl.reserved,
		Active:        sl.active,
		Allocated:     sl.active - min(sl.active, 2*MiB),
		InactiveSplit: sl.split,
		PeakReserved:  sl.peakRes,
		PeakActive:    sl.peakAct,
		Limit:         sl.limit,
		AllocRetries:  sl.retries,
		OOMs:          sl.ooms,
	}
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
				sl.oomThisStep = &SimOOM{PID: sl.pid, UUID: SimUUIDs[sl.gpu], Requested: sl.spike, Limit: sl.limit}
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
	sl.pid = uint32(simPIDBase + sl.gpu*10000 + sl.slot*100 + sl.generation%100)
	sl.reserved = 20 * MiB
	sl.active = 0
	sl.split = 0
	sl.peakRes, sl.peakAct = sl.reserved, 0
	sl.retries, sl.ooms = 0, 0
}
