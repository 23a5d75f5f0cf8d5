// Package simulate is the node behind --nvml.backend=simulated: eight H200
// GPUs on go-nvml's dgxh200 mock whose processes behave like PyTorch
// training and inference jobs (the scenarios of simulate/scenario), or, for
// load tests, a fixed number of simple processes per GPU. Its processes
// report their allocator state to the store as instrumented clients do,
// each through a session of its own, and it names their pods and Slurm
// jobs as the workload cache would.
package simulate

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
	"github.com/gpumem/gpumem_exporter/workload"
)

// Figures of the simulated node, taken from a real H200 (docs/validation.md).
const (
	MiB = 1 << 20
	GiB = 1 << 30

	TotalBytes    = scenario.TotalBytes          // 143771 MiB
	DriverReserve = scenario.DriverReservedBytes // NVML v2 reserved at idle
	ContextBytes  = scenario.CUDAContextBytes    // PyTorch's CUDA context on an H200

	// pidBase keeps simulated pids clear of the host's real ones, so that
	// /proc never describes a simulated process.
	pidBase = 4100000
	// uidBase is the first of the simulated processes' uids. Each process
	// (each slot, in the load scenario) reports under a uid of its own,
	// as the users of a shared node do, so that the store's per-uid
	// process caps bind it no more than they bind them; the range is
	// above those of users and of containers' mapped uids, clear of the
	// real clients' uids.
	uidBase = 1879048192
)

// Load is the scenario of load tests: ProcessesPerGPU simple processes on
// every GPU that grow, spike, release memory and exit on a fixed schedule.
const Load = "load"

// Scenarios lists what Config.Scenario takes.
func Scenarios() []string { return append(scenario.Names(), Load) }

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

// Session is a simulated process's client of the allocator store: an
// *allocstats.Session, which the socket server also opens for each
// connection of an instrumented process.
type Session interface {
	Hello(h allocstats.Hello) error
	Stats(devices []allocstats.DeviceReport, now time.Time) error
	OOM(m allocstats.OOMMessage, now time.Time, replyTo allocstats.Replier) (allocstats.OOMEvent, error)
	Close(now time.Time)
	Listen(r allocstats.Replier)
}

// Sessions returns what Config.Open takes for store: each simulated
// process reports to store through a session of its own.
func Sessions(store *allocstats.Store) func(allocstats.Identity) Session {
	return func(id allocstats.Identity) Session { return store.Open(id, 0) }
}

// Config configures the simulated node.
type Config struct {
	// Scenario is one of Scenarios(); empty: Load when ProcessesPerGPU is
	// set, else scenario.Mix.
	Scenario string
	// ProcessesPerGPU is the Load scenario's size (default 3).
	ProcessesPerGPU int
	Seed            int64
	// Open opens the session of a simulated process that reports its
	// allocator state, at its first report (Sessions(store)); the node
	// closes it when the process exits. nil: the processes report to
	// nobody.
	Open func(id allocstats.Identity) Session
	// Now is the clock: each Step advances the node by the time since the
	// last one (time.Now by default), times Speed (default 1; 60 runs an
	// hour of the scenario in a minute, for demos and tests).
	Now   func() time.Time
	Speed float64
}

// process is one simulated process on its GPU after a step.
type process struct {
	pid, gpu int
	start    uint64 // start time in clock ticks, never 0
	uid      uint32
	used     uint64
	info     workload.Info
	report   *allocstats.DeviceReport // nil for a process that reports nothing
}

// oomEvent is an out-of-memory error of a simulated process.
type oomEvent struct {
	pid, gpu         int
	start            uint64
	uid              uint32
	requested, limit uint64
	free             uint64
	// report is the process's allocator at the failure, which its client
	// sends just before the oom message; nil where the script has none.
	report *allocstats.DeviceReport
	// ago is how long before the end of the step the error was raised.
	ago time.Duration
}

// state is the node after a step: what NVML and the clients report.
type state struct {
	gpuUsed   [8]uint64
	processes []process // by GPU, then pid
	exited    []int
	// final holds the last state of the processes that exited during the
	// step, where the script knows it: what their client pushed last (at
	// Speed 60 a process can raise an OOM, push its counters and exit
	// within one step).
	final []process
	ooms  []oomEvent
}

// script advances a simulated node.
type script interface {
	step(dt time.Duration) state
	// maxProcesses is the most processes the script runs at once.
	maxProcesses() int
}

// Node is the simulated node. Step advances it (each poll of Advancing
// does); NVML and the sink see the state of the last step.
type Node struct {
	cfg    Config
	server *server.Server
	script script

	mu   sync.Mutex
	last time.Time
	// clock is the simulated time: the first Step's, then advanced by
	// each Step's simulated time. Allocator states are stamped with it,
	// so that windows over them (the floor of active memory) span
	// simulated time at any Speed.
	clock time.Time
	state state
	pids  map[uint32]*process

	// reportMu serialises the reports of Steps; it guards sessions.
	reportMu sync.Mutex
	// sessions are the open sessions of the processes that reported, by
	// pid.
	sessions map[uint32]openSession
}

// openSession is the session of the process of a pid that started at
// start.
type openSession struct {
	start   uint64
	session Session
}

// New builds the node.
func New(cfg Config) (*Node, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Scenario == "" {
		cfg.Scenario = scenario.Mix
		if cfg.ProcessesPerGPU > 0 {
			cfg.Scenario = Load
		}
	}
	n := &Node{cfg: cfg, server: dgxh200.New(), pids: map[uint32]*process{}, sessions: map[uint32]openSession{}}
	switch cfg.Scenario {
	case Load:
		n.script = newLoadScript(cfg.ProcessesPerGPU, cfg.Seed)
	default:
		sc, err := scenario.New(cfg.Scenario, uint64(cfg.Seed))
		if err != nil {
			return nil, fmt.Errorf("simulated node: %w", err)
		}
		n.script = &scenarioScript{node: sc}
	}
	n.server.DriverVersion = "580.159.04"
	n.server.NvmlVersion = "13.580.159.04"
	n.server.CudaDriverVersion = 13000
	for i := range UUIDs {
		n.wireDevice(i)
	}
	n.server.SystemGetProcessNameFunc = func(pid int) (string, nvml.Return) {
		n.mu.Lock()
		defer n.mu.Unlock()
		if p, ok := n.pids[uint32(pid)]; ok {
			return p.info.Comm, nvml.SUCCESS
		}
		return "", nvml.ERROR_NOT_FOUND
	}
	return n, nil
}

// Interface returns the simulated NVML library as it stands after the
// last Step: reading it never moves the node.
func (n *Node) Interface() nvml.Interface { return n.server }

// Advancing returns the simulated NVML library of a running node: each
// count of devices, with which every NVML poll begins, first steps the node
// to now, so that the poll reads the state at its own time. The exporter
// polls this one.
func (n *Node) Advancing() nvml.Interface { return advancing{n.server, n} }

// advancing is the node's NVML whose DeviceGetCount steps the node.
type advancing struct {
	nvml.Interface
	node *Node
}

func (a advancing) DeviceGetCount() (int, nvml.Return) {
	a.node.Step()
	return a.Interface.DeviceGetCount()
}

// Scenario is what the node runs.
func (n *Node) Scenario() string { return n.cfg.Scenario }

// MaxProcesses is the most processes the node runs at once.
func (n *Node) MaxProcesses() int { return n.script.maxProcesses() }

func (n *Node) wireDevice(i int) {
	d := n.server.Devices[i].(*server.Device)
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
		n.mu.Lock()
		defer n.mu.Unlock()
		used := n.state.gpuUsed[i]
		return nvml.Memory_v2{Version: 2, Total: TotalBytes, Reserved: DriverReserve, Used: used, Free: TotalBytes - DriverReserve - used}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		n.mu.Lock()
		defer n.mu.Unlock()
		used := n.state.gpuUsed[i] + DriverReserve
		return nvml.Memory{Total: TotalBytes, Used: used, Free: TotalBytes - used}, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		n.mu.Lock()
		defer n.mu.Unlock()
		var out []nvml.ProcessInfo
		for _, p := range n.state.processes {
			if p.gpu == i {
				out = append(out, nvml.ProcessInfo{Pid: uint32(p.pid), UsedGpuMemory: p.used, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, nvml.SUCCESS
	}
}

// Step advances the node by the time since the last Step (a first Step
// starts it), and its processes report their allocator state.
func (n *Node) Step() {
	now := n.cfg.Now()
	n.mu.Lock()
	var dt time.Duration
	if !n.last.IsZero() {
		dt = time.Duration(float64(now.Sub(n.last)) * n.cfg.Speed)
	} else {
		n.clock = now
	}
	n.last = now
	// A step longer than a client's push interval (a fast Speed, a slow
	// poll) runs in sub-steps of it, each reported at its own simulated
	// time: the store and the trends see what a client pushing once a
	// second would have pushed, at any Speed. NVML shows the last.
	var steps []sampledState
	for _, d := range subSteps(dt) {
		n.clock = n.clock.Add(d)
		steps = append(steps, sampledState{n.script.step(d), n.clock})
	}
	n.state = steps[len(steps)-1].state
	clear(n.pids)
	for i := range n.state.processes {
		p := &n.state.processes[i]
		n.pids[uint32(p.pid)] = p
	}
	n.mu.Unlock()
	if n.cfg.Open != nil {
		for _, s := range steps {
			n.report(s.state, s.at, now)
		}
	}
}

// sampledState is the node after a sub-step, at its simulated time.
type sampledState struct {
	state
	at time.Time
}

// pushInterval is how often a simulated client pushes its allocator
// state, in simulated time, as the Python client does; maxSubSteps bounds
// the sub-steps of one Step (a longer Step takes longer sub-steps).
const (
	pushInterval = time.Second
	maxSubSteps  = 120
)

// subSteps cuts dt into sub-steps of pushInterval (at most maxSubSteps of
// them, the last taking the rest); a first Step (dt 0) is one sub-step.
func subSteps(dt time.Duration) []time.Duration {
	n := int(dt / pushInterval)
	if n <= 1 {
		return []time.Duration{dt}
	}
	n = min(n, maxSubSteps)
	each := dt / time.Duration(n)
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = each
	}
	out[n-1] = dt - each*time.Duration(n-1)
	return out
}

// report sends what the step's processes' clients send, received at now;
// sampled is the simulated time of the step. The OOMs come first, in the
// order they were raised, each as a client sends it: the allocator's
// stats read at the failure, then the oom message. Then the processes
// that exited: their last stats, then the end of their session (the
// store keeps their counters for the OOM linger once it finds them gone).
// Then the live processes' state now, after their errors.
func (n *Node) report(st state, sampled, now time.Time) {
	n.reportMu.Lock()
	defer n.reportMu.Unlock()
	stats := func(pid int, start uint64, uid uint32, r allocstats.DeviceReport) {
		if s := n.session(pid, start, uid, now); s != nil {
			n.check(pid, s.Stats([]allocstats.DeviceReport{r}, now), now)
		}
	}
	for _, o := range st.ooms {
		if o.report != nil {
			r := *o.report
			r.At = sampled.Add(-o.ago)
			stats(o.pid, o.start, o.uid, r)
		}
		if s := n.session(o.pid, o.start, o.uid, now); s != nil {
			_, err := s.OOM(allocstats.OOMMessage{
				UUID: UUIDs[o.gpu], RequestedBytes: o.requested, LimitBytes: allocstats.Some(o.limit), FreeBytes: allocstats.Some(o.free),
			}, now, nil)
			n.check(o.pid, err, now)
		}
	}
	for _, p := range st.final {
		if p.report != nil {
			r := *p.report
			r.At = sampled
			stats(p.pid, p.start, p.uid, r)
		}
	}
	for _, pid := range st.exited {
		n.closeSession(uint32(pid), now)
	}
	for _, p := range st.processes {
		if p.report != nil {
			r := *p.report
			r.At = sampled
			stats(p.pid, p.start, p.uid, r)
		}
	}
}

// scriptedClient is a simulated process's end of the daemon's messages:
// it takes them and reads none.
type scriptedClient struct{}

// Reply implements allocstats.Replier.
func (scriptedClient) Reply([]byte) {}

// session returns the open session of the process pid started at start,
// opening it, with the client's hello, at the process's first report (and
// closing an earlier holder's of the pid); nil when the store refuses it.
// The caller holds reportMu.
func (n *Node) session(pid int, start uint64, uid uint32, now time.Time) Session {
	if o, ok := n.sessions[uint32(pid)]; ok {
		if o.start == start {
			return o.session
		}
		n.closeSession(uint32(pid), now)
	}
	s := n.cfg.Open(allocstats.Identity{PID: uint32(pid), UID: uid, StartTime: start})
	// A simulated client takes the daemon's warnings as a real one does
	// (and, being a script, goes on as it would have).
	s.Listen(scriptedClient{})
	if err := s.Hello(allocstats.Hello{Framework: "pytorch"}); err != nil {
		s.Close(now)
		return nil
	}
	n.sessions[uint32(pid)] = openSession{start, s}
	return s
}

// check ends the session of pid when the store refused a message of it:
// the next report opens a new one, as a client reconnects. The caller
// holds reportMu.
func (n *Node) check(pid int, err error, now time.Time) {
	if err != nil {
		n.closeSession(uint32(pid), now)
	}
}

// closeSession ends the session of pid, if any. The caller holds reportMu.
func (n *Node) closeSession(pid uint32, now time.Time) {
	if o, ok := n.sessions[pid]; ok {
		o.session.Close(now)
		delete(n.sessions, pid)
	}
}

// Alive reports whether pid is a live process of the node, and known
// whether pid is the node's at all (its pids are above any real one's
// range). start is not compared: when the node reuses a pid, the new
// process's first report replaces the old one's entry in the store.
func (n *Node) Alive(pid uint32, start uint64) (alive, known bool) {
	if !n.Sees(pid) {
		return false, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	_, alive = n.pids[pid]
	return alive, true
}

// Sees reports whether the node's NVML can list pid: only its own
// processes, never a real one.
func (n *Node) Sees(pid uint32) bool { return pid >= pidBase }

// Lookup names a simulated process as the workload cache names a real one:
// comm, and the pod or Slurm job it belongs to.
func (n *Node) Lookup(pid uint32) (workload.Info, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.pids[pid]
	if !ok {
		return workload.Info{}, false
	}
	return p.info, true
}
