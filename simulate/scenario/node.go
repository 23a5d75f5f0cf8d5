package scenario

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// Sizes of the simulated node, measured on an H200 (docs/validation.md).
const (
	MiB = 1 << 20
	GiB = 1 << 30

	// GPUs is the number of GPUs of a node.
	GPUs = 8
	// TotalBytes is each GPU's total memory.
	TotalBytes uint64 = 150754820096
	// DriverReservedBytes is what the driver and firmware keep (NVML v2
	// reserved); it is never part of used.
	DriverReservedBytes uint64 = 644939776
	// CUDAContextBytes is PyTorch's CUDA context on an H200: the least a
	// process's context can be.
	CUDAContextBytes uint64 = 520 * MiB

	// pageBytes is the allocator's granularity: reserved is a multiple of it.
	pageBytes = 2 * MiB
	// blockBytes is the granularity of active, allocated and inactive_split.
	blockBytes = 512
	// usableBytes is what processes can hold on a GPU.
	usableBytes = TotalBytes - DriverReservedBytes
)

// Identity says whose a process is: enough for alerts to group the
// processes of one workload (a pod, a Slurm job, or the process alone).
type Identity struct {
	// Job names the job on this node; it stays the same when the job
	// restarts with new processes (a pod's containers restart in the same
	// pod, a Slurm job is requeued under its id).
	Job  string
	Comm string
	// Namespace, Pod and Container are empty outside Kubernetes.
	Namespace, Pod, Container string
	// SlurmJobID is empty outside Slurm.
	SlurmJobID string
	// Rank is the process's rank in its job (0 for a job of one process).
	Rank int
}

// Process is one process on one GPU at the time of a Tick. Sizes are in
// bytes. For processes that report allocator statistics (ReportsAllocator),
// Used = Context + Reserved and Reserved = Active + Inactive; for the
// others only Used and Context + Reserved's sum mean anything.
type Process struct {
	PID int
	GPU int // NVML index, 0..GPUs-1
	Identity
	// Kind is the workload the process runs (Steady, Leak, ...).
	Kind string
	// Started is the simulated time the process started.
	Started time.Duration
	// ReportsAllocator is false for a process that sends no allocator
	// statistics (NVML lists it, nothing more is known).
	ReportsAllocator bool

	Context       uint64 // CUDA context + memory outside the allocator
	Reserved      uint64 // allocator reserved, a multiple of 2 MiB
	Active        uint64 // allocator active, <= Reserved
	Allocated     uint64 // allocator allocated, <= Active
	InactiveSplit uint64 // inactive memory in split segments, <= Inactive()
	PeakReserved  uint64
	PeakActive    uint64
	Limit         uint64 // per-process limit; 0 when none is set
	AllocRetries  uint64 // counter, from 0 for each process
	OOMs          uint64 // counter, from 0 for each process
	// LastOOMRequest and LastOOMAt describe the last OOM (zero before any).
	LastOOMRequest uint64
	LastOOMAt      time.Duration
}

// Used is NVML's usedGpuMemory for the process: context + reserved.
func (p Process) Used() uint64 { return p.Context + p.Reserved }

// Inactive is reserved - active: cached memory no tensor uses.
func (p Process) Inactive() uint64 { return p.Reserved - p.Active }

// GPU is one GPU at the time of a Tick, as NVML's memory info v2 gives it:
// Total = Free + Used + DriverReserved, Used = the processes' used +
// Unattributed.
type GPU struct {
	Index          int
	Total          uint64
	DriverReserved uint64
	Used           uint64
	Free           uint64
	// Unattributed is used memory that no listed process accounts for
	// (processes in another PID namespace, MPS).
	Unattributed uint64
	// Processes is how many processes hold a context on the GPU.
	Processes int
}

// OOM is one out-of-memory error, as the allocator's observer reports it.
type OOM struct {
	At  time.Duration
	PID int
	GPU int
	Identity
	Kind string
	// Requested is the rounded size of the allocation that failed.
	Requested uint64
	// Limit is the process's limit, or the GPU's total when none is set.
	Limit uint64
	// Free is the GPU's free memory when the allocation failed.
	Free uint64
	// Caught says the program caught the error and lives on; otherwise
	// the process exits a few seconds later.
	Caught bool
	// AtFailure is the process at the failure, as memory_stats() reads
	// inside PyTorch's out-of-memory observer, before the error unwinds:
	// the counters count this OOM and its retry; the flush left only
	// split segments cached, so InactiveSplit is all of its inactive
	// memory; the step's tensors allocated up to the failure are still
	// active, and fill the rest of Reserved. The process's state after the
	// error (the step's tensors freed, the cache kept) is what the next
	// Tick shows.
	AtFailure Process
}

// Tick is the node's state after an Advance, with what happened during it.
type Tick struct {
	// Elapsed is the simulated time since the node was created.
	Elapsed time.Duration
	// GPUs holds the GPUs by index.
	GPUs []GPU
	// Processes holds the live processes, by GPU then PID.
	Processes []Process
	// Exited holds the processes that exited during the step, in their
	// last state.
	Exited []Process
	// OOMs holds the out-of-memory errors raised during the step, in time
	// order.
	OOMs []OOM
}

// Node is a simulated node running one scenario. It is not safe for
// concurrent use.
type Node struct {
	scenario     string
	now          time.Duration
	jobs         []*job
	unattributed [GPUs]uint64
	pidRNG       *rand.Rand
	nextPID      int
	exited       []Process
	ooms         []OOM
}

// New returns a node running the named scenario (one of Names()), its
// random choices drawn from seed.
func New(scenario string, seed uint64) (*Node, error) {
	layout, ok := layouts[scenario]
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q (known: %v)", scenario, Names())
	}
	n := &Node{
		scenario: scenario,
		pidRNG:   rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)),
	}
	n.nextPID = 3000 + n.pidRNG.IntN(4000)
	specs, unattributed := layout()
	n.unattributed = unattributed
	for i, spec := range specs {
		j := &job{spec: spec, index: i, rng: rand.New(rand.NewPCG(seed, uint64(i)+1))}
		n.jobs = append(n.jobs, j)
	}
	// Jobs start in order, each planning on what the ones before it
	// planned to leave; a job that comes later waits for its time.
	for _, j := range n.jobs {
		if j.spec.startAfter > 0 {
			j.restartAt = j.spec.startAfter
			continue
		}
		n.start(j)
	}
	return n, nil
}

// Scenario is the name the node was created with.
func (n *Node) Scenario() string { return n.scenario }

// MaxProcesses is the most processes the node runs at once: one per rank
// of each job.
func (n *Node) MaxProcesses() int {
	total := 0
	for _, j := range n.jobs {
		total += len(j.spec.gpus)
	}
	return total
}

// Elapsed is the simulated time since the node was created.
func (n *Node) Elapsed() time.Duration { return n.now }

// Advance runs the node for dt of simulated time and returns its state at
// the end, with the processes that exited and the OOMs raised meanwhile.
func (n *Node) Advance(dt time.Duration) Tick {
	if dt < 0 {
		dt = 0
	}
	target := n.now + dt
	for {
		at, j, p := n.nextEvent()
		if j == nil || at > target {
			break
		}
		n.now = at
		switch {
		case p == nil:
			n.start(j)
		case p.dying:
			n.exit(p)
		default:
			n.runStep(p)
		}
	}
	n.now = target
	t := n.snapshot()
	t.Exited, n.exited = n.exited, nil
	t.OOMs, n.ooms = n.ooms, nil
	return t
}

// nextEvent returns the earliest pending event: a job to start again (p
// nil), a process to exit (p dying) or a process's next step. Ties go to
// the job listed first, then the lowest rank, so the order never depends
// on how time was cut into Advance calls.
func (n *Node) nextEvent() (time.Duration, *job, *proc) {
	var (
		best  time.Duration
		bestJ *job
		bestP *proc
	)
	for _, j := range n.jobs {
		if len(j.procs) == 0 {
			if bestJ == nil || j.restartAt < best {
				best, bestJ, bestP = j.restartAt, j, nil
			}
			continue
		}
		for _, p := range j.procs {
			at := p.next
			if p.dying {
				at = p.exitAt
			}
			if bestJ == nil || at < best {
				best, bestJ, bestP = at, j, p
			}
		}
	}
	return best, bestJ, bestP
}

// job is a group of processes that start, fail and restart together: one
// process, or the ranks of a multi-rank job.
type job struct {
	spec      jobSpec
	index     int
	rng       *rand.Rand
	gen       int
	procs     []*proc
	restartAt time.Duration
}

// proc is a live process: its public state and its program.
type proc struct {
	Process
	job  *job
	rng  *rand.Rand
	prog *program

	// The step running now.
	stepStart   time.Duration
	stepLen     time.Duration
	floor, peak uint64
	next        time.Duration // when the next step starts

	planned   uint64  // what the job planned on when p started
	dwell     float64 // part of a step spent at the floor (loading data)
	frag      float64 // what fragmentation adds to a step's peak in reserved
	split     float64 // part of inactive memory in split segments
	allocGap  float64 // active - allocated, as a part of active
	catches   bool    // the program catches out-of-memory errors
	dying     bool
	exitAt    time.Duration
	lingerMin time.Duration
	lingerMax time.Duration
}

// tightFrag is what fragmentation adds to a step's peak right after a flush
// of the cache, when fresh segments hold the step's tensors.
const tightFrag = 0.005

// start starts a new generation of j's processes.
func (n *Node) start(j *job) {
	j.gen++
	j.procs = nil
	// One draw per job generation, shared by its ranks.
	shared := j.rng.Uint64()
	for rank, gpu := range j.spec.gpus {
		p := &proc{job: j}
		p.rng = rand.New(rand.NewPCG(shared, uint64(rank)+1))
		p.PID = n.newPID()
		p.GPU = gpu
		p.Identity = j.spec.identity
		p.Identity.Rank = rank
		p.Kind = j.spec.kind
		p.Started = n.now
		p.ReportsAllocator = j.spec.kind != NVMLOnly
		p.stepStart, p.stepLen = n.now, time.Second
		p.next = n.now
		j.procs = append(j.procs, p)
	}
	for _, p := range j.procs {
		p.planned = n.capacityFor(p, j.spec.share)
		p.prog = newProgram(p, p.planned, shared)
	}
	if j.spec.identity.Pod == "" && j.spec.identity.SlurmJobID == "" && len(j.procs) == 1 {
		// A plain process is known by its pid.
		j.procs[0].Job = fmt.Sprintf("%s-pid-%d", j.spec.identity.Job, j.procs[0].PID)
	}
}

func (n *Node) newPID() int {
	n.nextPID += 1 + n.pidRNG.IntN(40)
	return n.nextPID
}

// capacityFor is what p's job may plan to use on p's GPU: its share of the
// GPU, at most what unattributed memory and the other processes there
// leave (each counted at the larger of what it uses and what it planned),
// unless the job plans regardless of the others.
func (n *Node) capacityFor(p *proc, share float64) uint64 {
	if p.job.spec.regardless {
		return uint64(float64(usableBytes) * share)
	}
	taken := n.unattributed[p.GPU]
	for _, j := range n.jobs {
		for _, q := range j.procs {
			if q.GPU == p.GPU && q != p {
				taken += max(q.Used(), q.planned)
			}
		}
	}
	left := usableBytes - min(taken, usableBytes)
	return min(uint64(float64(usableBytes)*share), left)
}

// used is what the processes on gpu and its unattributed memory hold.
func (n *Node) used(gpu int) uint64 {
	u := n.unattributed[gpu]
	for _, j := range n.jobs {
		for _, p := range j.procs {
			if p.GPU == gpu {
				u += p.Used()
			}
		}
	}
	return u
}

func (n *Node) free(gpu int) uint64 { return usableBytes - n.used(gpu) }

// runStep starts p's next step: the allocator reserves for its peak
// (growing, flushing and retrying, or failing).
func (n *Node) runStep(p *proc) {
	s := p.prog.step(p, n.now, func() uint64 { return n.capacity(p) })
	if p.Context == 0 {
		if n.free(p.GPU) < p.prog.context {
			// No room even for the context: CUDA init fails; try later.
			n.die(p, n.now+time.Second)
			return
		}
		p.Context = p.prog.context
		p.Limit = p.prog.limit
	}
	f, ok := n.allocate(p, s)
	p.PeakReserved = max(p.PeakReserved, p.Reserved)
	if !ok {
		n.oom(p, f)
		if !p.catches {
			return
		}
		s.peak = s.floor // the failed request never ran
	}
	p.stepStart, p.stepLen = n.now, s.length
	p.floor, p.peak = s.floor, s.peak
	p.PeakActive = max(p.PeakActive, s.peak)
	p.PeakReserved = max(p.PeakReserved, p.Reserved)
	p.next = n.now + s.length
}

// capacity is the most p's allocator can reserve now: what it holds plus
// the GPU's free memory, or its limit.
func (n *Node) capacity(p *proc) uint64 {
	c := p.Reserved + n.free(p.GPU)
	if p.Limit > 0 && p.Limit < c {
		c = p.Limit
	}
	return c
}

// inactiveSplit is what p's cache holds in split segments between steps.
func (p *proc) inactiveSplit() uint64 {
	return uint64(float64(p.Reserved-min(p.floor, p.Reserved)) * p.split)
}

// failure is the allocator at an OOM, before the error unwinds.
type failure struct {
	requested     uint64
	active        uint64
	inactiveSplit uint64
}

// allocate reserves for step s's peak. It returns false and the allocator
// at the failure when even a flush of the cache leaves no room.
func (n *Node) allocate(p *proc, s step) (failure, bool) {
	need := pageUp(s.peak + uint64(float64(s.peak)*p.frag))
	if s.stuck {
		// No block of the cache's split segments fits the step's large
		// tensors: what they hold is of no use to the step.
		need += pageUp(p.inactiveSplit())
	}
	if p.Reserved >= need {
		return failure{}, true
	}
	capacity := n.capacity(p)
	if need <= capacity {
		p.Reserved = need
		return failure{}, true
	}
	// cudaMalloc failed: flush the cache's unsplit segments, retry once
	// with fresh segments. An OOM counts its retry too. The split
	// segments stay, and so does the inactive memory in them.
	p.AllocRetries++
	split := p.inactiveSplit()
	afterFlush := min(pageUp(p.floor+split), p.Reserved)
	tight := pageUp(s.peak + uint64(float64(s.peak)*tightFrag))
	if s.stuck {
		// No split block fits the step's large tensors: all of them
		// need fresh segments beside the split ones.
		tight = pageUp(s.peak + uint64(float64(s.peak)*tightFrag) + split)
	}
	if tight <= capacity {
		p.Reserved = max(tight, afterFlush)
		return failure{}, true
	}
	// After the flush the step's tensors went into fresh segments until
	// one did not fit: reserved stands within one request of the capacity
	// (a request larger than the capacity fails at once, and so does a
	// step that is one allocation, such as a chunk of weights). The error
	// frees the step's tensors, not the cache.
	p.Reserved = afterFlush
	if s.request < capacity && !s.single {
		room := uint64(float64(s.request) * between(p.rng, 0.05, 0.95))
		p.Reserved = max(afterFlush, pageDown(capacity-room))
	}
	// At the failure the split segments' free blocks are all the cache
	// holds; the step's tensors allocated so far (never less than the
	// step's floor) fill the rest of reserved.
	f := failure{requested: s.request}
	f.inactiveSplit = min(blockDown(split), p.Reserved-min(p.Reserved, s.floor))
	f.active = p.Reserved - f.inactiveSplit
	return f, false
}

// oom records an out-of-memory error of p, failed as f; unless p catches
// it, p exits after a few seconds and its job's other ranks follow.
func (n *Node) oom(p *proc, f failure) {
	p.OOMs++
	p.LastOOMRequest = f.requested
	p.LastOOMAt = n.now
	p.PeakActive = max(p.PeakActive, f.active)
	limit := p.Limit
	if limit == 0 {
		limit = TotalBytes
	}
	at := p.Process
	at.Active = f.active
	at.Allocated = blockDown(f.active - uint64(float64(f.active)*p.allocGap))
	at.InactiveSplit = f.inactiveSplit
	n.ooms = append(n.ooms, OOM{
		At: n.now, PID: p.PID, GPU: p.GPU, Identity: p.Identity, Kind: p.Kind,
		Requested: f.requested, Limit: limit, Free: n.free(p.GPU), Caught: p.catches,
		AtFailure: at,
	})
	if p.catches {
		return
	}
	n.die(p, n.now+p.linger())
	for _, q := range p.job.procs {
		if q != p && !q.dying {
			// torchrun sees the failed worker and stops the others.
			n.die(q, n.now+3*time.Second+time.Duration(q.rng.Int64N(int64(12*time.Second))))
		}
	}
}

func (p *proc) linger() time.Duration {
	return p.lingerMin + time.Duration(p.rng.Int64N(int64(p.lingerMax-p.lingerMin)+1))
}

// die makes p stop stepping and exit at the given time. Until then it
// holds its memory with the step's tensors freed.
func (n *Node) die(p *proc, at time.Duration) {
	if p.dying && p.exitAt <= at {
		return
	}
	p.dying = true
	p.exitAt = at
	p.peak = p.floor
	p.stepStart, p.stepLen = n.now, time.Second
}

// exit removes p; when its job has no process left, the job restarts after
// its back-off.
func (n *Node) exit(p *proc) {
	n.exited = append(n.exited, n.sample(p))
	j := p.job
	for i, q := range j.procs {
		if q == p {
			j.procs = append(j.procs[:i], j.procs[i+1:]...)
			break
		}
	}
	if len(j.procs) == 0 {
		lo, hi := j.spec.restartMin, j.spec.restartMax
		j.restartAt = n.now + lo + time.Duration(j.rng.Int64N(int64(hi-lo)+1))
	}
}

// snapshot returns the node's state now.
func (n *Node) snapshot() Tick {
	t := Tick{Elapsed: n.now, GPUs: make([]GPU, GPUs)}
	for g := range t.GPUs {
		used := n.used(g)
		t.GPUs[g] = GPU{
			Index: g, Total: TotalBytes, DriverReserved: DriverReservedBytes,
			Used: used, Free: usableBytes - used, Unattributed: n.unattributed[g],
		}
	}
	for _, j := range n.jobs {
		for _, p := range j.procs {
			if p.Context == 0 {
				continue // not started on the GPU yet
			}
			t.Processes = append(t.Processes, n.sample(p))
			t.GPUs[p.GPU].Processes++
		}
	}
	sort.Slice(t.Processes, func(a, b int) bool {
		pa, pb := t.Processes[a], t.Processes[b]
		if pa.GPU != pb.GPU {
			return pa.GPU < pb.GPU
		}
		return pa.PID < pb.PID
	})
	return t
}

// sample is p's state now: active where the sawtooth of the running step
// stands, the rest derived from it.
func (n *Node) sample(p *proc) Process {
	s := p.Process
	active := p.floor
	if p.peak > p.floor && p.stepLen > 0 {
		u := float64(n.now-p.stepStart) / float64(p.stepLen)
		active += uint64(float64(p.peak-p.floor) * sawtooth(u, p.dwell))
	}
	active = min(blockDown(active), s.Reserved)
	s.Active = active
	s.Allocated = blockDown(active - uint64(float64(active)*p.allocGap))
	s.InactiveSplit = blockDown(uint64(float64(s.Reserved-active) * p.split))
	return s
}

// sawtooth is where active stands within a step, from 0 (the floor) to 1
// (the peak), at u in [0, 1): the floor while the batch loads, up in the
// forward pass, down in the backward pass.
func sawtooth(u, dwell float64) float64 {
	const forward = 0.35 // the forward pass's part of the compute
	switch {
	case u < dwell || u >= 1:
		return 0
	case u < dwell+(1-dwell)*forward:
		return (u - dwell) / ((1 - dwell) * forward)
	default:
		return (1 - u) / ((1 - dwell) * (1 - forward))
	}
}

func pageUp(b uint64) uint64    { return (b + pageBytes - 1) / pageBytes * pageBytes }
func pageDown(b uint64) uint64  { return b / pageBytes * pageBytes }
func blockDown(b uint64) uint64 { return b / blockBytes * blockBytes }
