package allocstats

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// DeviceStats is the allocator state of one process on one device as the
// store keeps it, built from the client's reports (DeviceReport, what a
// client said) by deviceEntry.apply and from its oom messages.
type DeviceStats struct {
	UUID string // as NVML spells it
	// HasStats is false when only an oom message named the device: Reserved
	// and the other allocator fields are then unknown (zero), and only the
	// LastOOM fields mean something.
	HasStats      bool
	Reserved      uint64
	Active        Optional
	Allocated     Optional
	InactiveSplit Optional
	PeakReserved  Optional
	PeakActive    Optional
	Limit         Optional
	// ActiveFloor is the least Active of the last 2 minutes of reports
	// (see ActiveFloor); absent while Active never came.
	ActiveFloor Optional
	// AllocRetries and OOMs never decrease within a process's life, even
	// when the client resets its counters.
	AllocRetries   Optional
	OOMs           Optional
	LastOOMRequest Optional
	LastOOMTime    time.Time // zero if none
	// LastReport is when a stats or oom message last named the device.
	LastReport time.Time
	// SampledAt is when the allocator state above was sampled: the
	// report's own time where its source sets one (the simulated node's
	// clock), else when it was received. Trends are read on this clock.
	SampledAt time.Time
}

// Inactive is reserved minus active (cached but unused), never below zero.
// It means something only when Active.OK; it is 0 otherwise.
func (d DeviceStats) Inactive() uint64 {
	if !d.Active.OK || d.Active.V >= d.Reserved {
		return 0
	}
	return d.Reserved - d.Active.V
}

// Process is what the store knows about one reporting process.
type Process struct {
	PID       uint32
	UID       uint32
	StartTime uint64 // clock ticks since boot (/proc/<pid>/stat field 22)
	// Framework, FrameworkVersion and Client come from hello, sanitised:
	// printable ASCII, at most 64 characters.
	Framework        string
	FrameworkVersion string
	Client           string
	// WarnBefore is the estimate of the time to OOM under which the
	// process asked for a warning in its hello (absent: the default).
	WarnBefore Optional
	Connected  bool // at least one session of the process is open
	// Exited says the process exited: it is kept for the linger (see
	// Store.SetLinger) so that its final counters are exported; its
	// memory fields describe memory it no longer holds.
	Exited  bool
	Devices []DeviceStats
}

// Device returns the process's stats for the device uuid.
func (p *Process) Device(uuid string) (DeviceStats, bool) {
	i := sort.Search(len(p.Devices), func(i int) bool { return p.Devices[i].UUID >= uuid })
	if i < len(p.Devices) && p.Devices[i].UUID == uuid {
		return p.Devices[i], true
	}
	return DeviceStats{}, false
}

// Store keeps the latest allocator state per process and device. It is safe
// for concurrent use. Processes report to it through sessions (Open), one
// per client: a connection of the socket, a simulated process. Its size is
// bounded: at most maxProcesses processes, running or lingering after their
// exit (maxPerUID of one uid), each with at most the devices-per-process
// cap of its sessions.
//
// Locking: readers (Processes, Process, PIDs, DropUnlisted) never take the
// store's lock: they read the index, a sorted slice that is replaced, never
// changed, behind an atomic pointer, and lock each entry only while they
// copy it. A session's messages lock only its own process's entry; the
// store's lock (mu) is taken to change the index: a session's first
// message, a new process, Prune, a session's close. Lock order:
// mu before an entry's mu.
type Store struct {
	ttl          time.Duration
	maxProcesses int
	maxPerUID    int

	mu    sync.Mutex
	procs map[uint32]*procEntry
	// index holds the entries of procs ordered by pid, so that Processes
	// costs no sort. It is replaced under mu and read without it.
	index atomic.Pointer[[]*procEntry]
	// nDevices is the number of device entries over the indexed processes.
	nDevices atomic.Int64
	// nProcs and perUID count the entries in procs.
	nProcs int
	perUID map[uint32]int
	// nGone and gonePerUID count the entries in gone: a lingering
	// process counts against its uid's caps like a live one.
	nGone      int
	gonePerUID map[uint32]int

	oomObservers    OOMObservers     // set before use, read without the lock
	sampleObservers []SampleObserver // likewise

	// linger is how long an exited process stays in gone.
	linger time.Duration
	// gone holds the entries of processes that exited, oldest first, for
	// the linger. Replaced under mu, read without it.
	gone atomic.Pointer[[]goneEntry]

	// version is Version's count, raised after each change it covers.
	version atomic.Uint64

	// prunedAt is when Prune last asked which processes still run (Unix
	// nanoseconds; 0 before the first time).
	prunedAt atomic.Int64
}

// Version counts the changes to what Processes returns: a process added,
// dropped or moved to the exited ones, a hello, a stats or oom line
// applied, a device dropped. Two equal values mean that Processes returned
// the same processes with the same figures in between (Connected aside:
// opening and closing sessions does not count). It is raised after
// the change is made, so a reader that reads Version and then Processes
// sees at least that version's state.
func (s *Store) Version() uint64 { return s.version.Load() }

type procEntry struct {
	// Set at creation, never changed.
	pid, uid  uint32
	startTime uint64

	// Changed under the store's mu.
	disconnectedAt time.Time // when conns last fell to 0
	// conns is the number of open sessions bound to the entry; changed
	// under the store's mu, read without it.
	conns atomic.Int32
	// removed is set under both the store's and the entry's mu; the server
	// reads it without either, to close the connections of removed
	// entries. A removed entry takes no message.
	removed atomic.Bool
	// exited: Prune found the process gone while a session of it was
	// still open. The entry is out of the index (no reader sees it, and a
	// new process with the same pid gets an entry of its own), but its
	// sessions still apply the lines the process queued before it
	// exited; the last one to close drops it (release). Set under both
	// the store's and the entry's mu.
	exited atomic.Bool

	// mu guards the fields below.
	mu               sync.Mutex
	framework        string
	frameworkVersion string
	client           string
	warnBefore       Optional
	devices          []*deviceEntry // sorted by UUID
	// listeners are the open sessions bound to the entry that take the
	// daemon's messages (Session.Listen): Send writes to them.
	listeners []*Session
}

type deviceEntry struct {
	stats   DeviceStats
	floor   ActiveFloor
	retries counterState
	ooms    counterState
	// unlistedSince is when DropUnlisted first found NVML not listing the
	// process on the device (zero while it is listed).
	unlistedSince time.Time
}

// NewStore returns an empty store with the default process limits. A
// process whose sessions are all closed is removed by the first Prune at
// least ttl after the last one closed (ttl <= 0: the first Prune after it
// closed).
func NewStore(ttl time.Duration) *Store {
	return &Store{
		ttl:          ttl,
		maxProcesses: DefaultMaxProcesses,
		maxPerUID:    DefaultMaxProcessesPerUID,
		procs:        make(map[uint32]*procEntry),
		perUID:       make(map[uint32]int),
		gonePerUID:   make(map[uint32]int),
	}
}

// Processes returns a deep copy of every process, sorted by pid, each with
// its devices sorted by UUID, followed by the processes that exited within
// the linger (Exited set; see SetLinger), also by pid. It takes no
// store-wide lock: it copies the processes of the index as it stood when
// called, locking each one only while it is copied, so ingest never makes
// it wait.
func (s *Store) Processes() []Process {
	sorted := s.sorted()
	var gone []goneEntry
	if g := s.gone.Load(); g != nil {
		gone = *g
	}
	out := make([]Process, len(sorted), len(sorted)+len(gone))
	// One backing array for all devices (two allocations in all, unless
	// devices were added meanwhile).
	all := make([]DeviceStats, 0, max(s.nDevices.Load(), 0))
	for i, e := range sorted {
		e.mu.Lock()
		start := len(all)
		for _, d := range e.devices {
			all = append(all, d.stats)
		}
		out[i] = e.snapshotLocked(all[start:len(all):len(all)])
		e.mu.Unlock()
	}
	if len(gone) == 0 {
		return out
	}
	for _, g := range gone {
		g.e.mu.Lock()
		devs := make([]DeviceStats, len(g.e.devices))
		for i, d := range g.e.devices {
			devs[i] = d.stats
		}
		p := g.e.snapshotLocked(devs)
		g.e.mu.Unlock()
		p.Exited = true
		out = append(out, p)
	}
	exited := out[len(sorted):]
	sort.SliceStable(exited, func(i, j int) bool { return exited[i].PID < exited[j].PID })
	return out
}

// Process returns a copy of one process.
func (s *Store) Process(pid uint32) (Process, bool) {
	sorted := s.sorted()
	i := sortedIndex(sorted, pid)
	if i == len(sorted) || sorted[i].pid != pid {
		return Process{}, false
	}
	e := sorted[i]
	e.mu.Lock()
	defer e.mu.Unlock()
	devs := make([]DeviceStats, len(e.devices))
	for i, d := range e.devices {
		devs[i] = d.stats
	}
	return e.snapshotLocked(devs), true
}

func (e *procEntry) snapshotLocked(devs []DeviceStats) Process {
	return Process{
		PID:              e.pid,
		UID:              e.uid,
		StartTime:        e.startTime,
		Framework:        e.framework,
		FrameworkVersion: e.frameworkVersion,
		Client:           e.client,
		WarnBefore:       e.warnBefore,
		Connected:        e.conns.Load() > 0,
		Devices:          devs,
	}
}

// PIDs returns the pids of every process in the store, sorted.
func (s *Store) PIDs() []uint32 {
	sorted := s.sorted()
	pids := make([]uint32, len(sorted))
	for i, e := range sorted {
		pids[i] = e.pid
	}
	return pids
}

// Identity is who sent a message: the pid and uid of the process (for a
// connection of the socket, what the kernel gives for its peer), and its
// start time (clock ticks since boot, /proc/<pid>/stat field 22), which
// tells two processes of one pid apart.
type Identity struct {
	PID, UID  uint32
	StartTime uint64
}

// sameProcess reports whether the entry describes the process id: the
// same pid, start time and uid.
func (e *procEntry) sameProcess(id Identity) bool {
	return e.pid == id.PID && e.startTime == id.StartTime && e.uid == id.UID
}
