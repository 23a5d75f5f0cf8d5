// Package simulate is the scripted node behind --nvml.backend=simulated:
// eight H200 GPUs on go-nvml's dgxh200 mock whose processes start, grow,
// spike, release memory and exit, and feed their allocator state to the
// store as instrumented clients would.
package simulate

import (
	"fmt"
	"math/rand"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpumem/gpumem_exporter/allocstats"
)

// Figures of the simulated node, taken from a real H200 (GPU-FACTS.md).
const (
	MiB = 1 << 20
	GiB = 1 << 30

	TotalBytes    = 150754820096 // 143771 MiB
	DriverReserve = 644939776    // NVML v2 reserved at idle
	ContextBytes  = 520 * MiB    // PyTorch's CUDA context on an H200
	// UnattributedGPU is the GPU on which memory is used by no listed
	// process (another PID namespace, MPS), and how much.
	UnattributedGPU   = 3
	UnattributedBytes = 3 * GiB
	// OOMGPU's first slot runs under a per-process limit and hits it.
	OOMGPU        = 5
	OOMLimitBytes = 40 * GiB
	pidBase       = 4100000
)

// UUIDs are the pinned UUIDs of the simulated node's eight GPUs.
var UUIDs = [8]string{
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000000",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000001",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000002",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000003",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000004",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000005",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006",
	"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000007",
}

// Sink takes the allocator state of the simulated processes: the
// allocstats store.
type Sink interface {
	Feed(id allocstats.Identity, framework string, devices []allocstats.DeviceReport, now time.Time) error
	FeedOOM(id allocstats.Identity, m allocstats.OOMMessage, now time.Time) (allocstats.OOMEvent, error)
	Remove(pid uint32)
}

// Config configures the simulated node.
type Config struct {
	ProcessesPerGPU int
	Seed            int64
	// Sink receives the allocator state after each step; may be nil.
	Sink Sink
	Now  func() time.Time
}

// oomEvent is an out-of-memory event of a simulated process.
type oomEvent struct {
	pid       uint32
	uuid      string
	requested uint64
	limit     uint64
	free      uint64
}

// Node is a scripted 8-GPU H200 node on go-nvml's dgxh200 mock:
// processes start, grow, spike, release memory, empty their cache and exit,
// each slot on its own deterministic schedule.
type Node struct {
	cfg    Config
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
	oomThisStep          *oomEvent
	exitedPID            uint32
	waitingUntilRestarts int
}

// New builds the node. Call Step to advance its script (the poller does
// before each poll).
func New(cfg Config) *Node {
	if cfg.ProcessesPerGPU <= 0 {
		cfg.ProcessesPerGPU = 3
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Node{cfg: cfg, server: dgxh200.New()}
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
			if i == OOMGPU && j == 0 {
				sl.limit = OOMLimitBytes
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
func (s *Node) Interface() nvml.Interface { return s.server }

func (s *Node) wireServer() {
	s.server.SystemGetProcessNameFunc = func(pid int) (string, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, g := range s.gpus {
			for _, sl := range g.slots {
				if sl.alive && int(sl.pid) == pid {
					return sl.comm, nvml.SUCCESS
				}
			}
		}
		return "", nvml.ERROR_NOT_FOUND
	}
}

func (s *Node) wireDevice(i int) {
	d := s.server.Devices[i].(*server.Device)
	d.UUID = UUIDs[i]
	d.Config.Name = "NVIDIA H200"
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		var p nvml.PciInfo
		id := fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
		for k := 0; k < len(id) && k < len(p.BusId)-1; k++ {
			p.BusId[k] = int8(id[k])
		}
		p.Bus = uint32(0x18 + i*0x10)
		return p, nvml.SUCCESS
	}
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		used := s.gpuUsed(i)
		return nvml.Memory_v2{Version: 2, Total: TotalBytes, Reserved: DriverReserve, Used: used, Free: TotalBytes - DriverReserve - used}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		used := s.gpuUsed(i) + DriverReserve
		return nvml.Memory{Total: TotalBytes, Used: used, Free: TotalBytes - used}, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []nvml.ProcessInfo
		for _, sl := range s.gpus[i].slots {
			if sl.alive {
				out = append(out, nvml.ProcessInfo{Pid: sl.pid, UsedGpuMemory: sl.used(), GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, nvml.SUCCESS
	}
}

// gpuUsed is called with s.mu held.
func (s *Node) gpuUsed(i int) uint64 {
	var used uint64
	for _, sl := range s.gpus[i].slots {
		if sl.alive {
			used += sl.used()
		}
	}
	if i == UnattributedGPU {
		used += UnattributedBytes
	}
	return used
}

func (sl *simSlot) used() uint64 { return ContextBytes + sl.reserved }

// Step advances the script by one tick and hands the allocator state to
// the sink.
func (s *Node) Step() {
	type report struct {
		id  allocstats.Identity
		dev allocstats.DeviceReport
	}
	var (
		exited  []uint32
		reports []report
		ooms    []oomEvent
	)
	s.mu.Lock()
	for _, g := range s.gpus {
		for _, sl := range g.slots {
			sl.step()
			if sl.exitedPID != 0 {
				exited = append(exited, sl.exitedPID)
			}
			if sl.oomThisStep != nil {
				oom := *sl.oomThisStep
				oom.free = TotalBytes - DriverReserve - s.gpuUsed(g.index)
				ooms = append(ooms, oom)
			}
			if sl.alive && sl.reporting {
				reports = append(reports, report{sl.identity(), sl.report()})
			}
		}
	}
	s.mu.Unlock()
	if s.cfg.Sink == nil {
		return
	}
	now := s.cfg.Now()
	for _, pid := range exited {
		s.cfg.Sink.Remove(pid)
	}
	for _, r := range reports {
		// Cannot fail: one known device per process.
		_ = s.cfg.Sink.Feed(r.id, "pytorch", []allocstats.DeviceReport{r.dev}, now)
	}
	for _, o := range ooms {
		_, _ = s.cfg.Sink.FeedOOM(allocstats.Identity{PID: o.pid, StartTime: startTime(o.pid)}, allocstats.OOMMessage{
			UUID: o.uuid, RequestedBytes: o.requested, LimitBytes: allocstats.Some(o.limit), FreeBytes: allocstats.Some(o.free),
		}, now)
	}
}

// Alive reports whether pid is a live process of the node, and ok whether
// the node knows pid at all (its pids are above any real one's range).
func (s *Node) Alive(pid uint32) (alive, ok bool) {
	if pid < pidBase {
		return false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.gpus {
		for _, sl := range g.slots {
			if sl.alive && sl.pid == pid {
				return true, true
			}
		}
	}
	return false, true
}

// startTime is a simulated process's start time: its pid names one life.
func startTime(pid uint32) uint64 { return uint64(pid) }

func (sl *simSlot) identity() allocstats.Identity {
	return allocstats.Identity{PID: sl.pid, StartTime: startTime(sl.pid)}
}

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
				sl.oomThisStep = &oomEvent{pid: sl.pid, uuid: UUIDs[sl.gpu], requested: sl.spike, limit: sl.limit}
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
