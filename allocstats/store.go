package allocstats

import (
	"errors"
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"math"
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
	StartTime uint64 // clock ticks since boot (/proc/<pid>/stat field 22); 0 if unknown
	// Framework, FrameworkVersion and Client come from hello, sanitised:
	// printable ASCII, at most 64 characters.
	Framework        string
	FrameworkVersion string
	Client           string
	Connected        bool // at least one connection of the process is open
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

// OOMEvent is one out-of-memory event, as recorded in the store.
type OOMEvent struct {
	Time      time.Time
	PID       uint32
	UID       uint32
	StartTime uint64
	UUID      string // as NVML spells it
	Requested uint64 // bytes the failed allocation asked for
	Limit     Optional
	Free      Optional
	// Stats is the process's allocator on the device as it stood when the
	// oom message came: a client sends its stats at the failure just
	// before it, so these are the figures at the failure.
	Stats DeviceStats
	// Reply, when set, sends one line back to the process (the daemon's
	// verdict); it never blocks for long and may fail silently.
	Reply func(line []byte)
}

// Errors of the store's admission rules.
var (
	// errProcessGone: the connection's process entry was removed (pruned,
	// replaced or dropped), so the connection is closed and its client
	// reconnects.
	errProcessGone = errors.New("the process's entry was removed from the store")
	// errIdentityConflict: the live process of the pid is recorded under
	// another uid; an entry of a live process is never replaced.
	errIdentityConflict = errors.New("the process is recorded under another uid")
	// errTooManyProcesses: the store holds --allocstats.max-processes
	// reporting processes.
	errTooManyProcesses = errors.New("too many reporting processes")
	// errTooManyProcessesForUID: the uid has
	// --allocstats.max-processes-per-uid reporting processes.
	errTooManyProcessesForUID = errors.New("too many reporting processes of this uid")
)

// Store keeps the latest allocator state per process and device. It is safe
// for concurrent use. Its size is bounded: at most maxProcesses processes
// that report over the socket, running or lingering after their exit
// (maxPerUID of one uid), each with at most
// the devices-per-process cap; fed processes are bounded by their source.
//
// Locking: readers (Processes, Process, PIDs, DropUnlisted) never take the
// store's lock: they read the index, a sorted slice that is replaced, never
// changed, behind an atomic pointer, and lock each entry only while they
// copy it. A connection's messages lock only its own process's entry; the
// store's lock (mu) is taken to change the index: a connection's first
// message, a new process, Prune, Remove, a connection's close. Lock order:
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
	// nSocket and perUID count the entries of socket peers (not fed).
	nSocket int
	perUID  map[uint32]int
	// nGone and gonePerUID count the socket peers' entries in gone: a
	// lingering process counts against its uid's caps like a live one.
	nGone      int
	gonePerUID map[uint32]int

	oomHooks []func(OOMEvent) // set before use, read without the lock

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

// prunedSince reports whether Prune, asking which processes still run,
// has completed at or after t: every process that had exited by then is
// marked exited or dropped.
func (s *Store) prunedSince(t time.Time) bool { return s.prunedAt.Load() >= t.UnixNano() }

// Version counts the changes to what Processes returns: a process added,
// dropped or moved to the exited ones, a hello, a stats or oom line
// applied, a device dropped. Two equal values mean that Processes returned
// the same processes with the same figures in between (Connected aside:
// opening and closing connections does not count). It is raised after
// the change is made, so a reader that reads Version and then Processes
// sees at least that version's state.
func (s *Store) Version() uint64 { return s.version.Load() }

// goneEntry is a process that exited at at.
type goneEntry struct {
	e  *procEntry
	at time.Time
}

// sorted returns the current index; the caller must not change it.
func (s *Store) sorted() []*procEntry {
	if p := s.index.Load(); p != nil {
		return *p
	}
	return nil
}

// publishLocked replaces the index.
func (s *Store) publishLocked(sorted []*procEntry) {
	s.index.Store(&sorted)
	s.version.Add(1)
}

// OnOOM adds f to the functions called, synchronously and without the
// store's lock, after each oom message the store records (from a
// connection or a feed). f must be fast. Add hooks before the store is
// used.
func (s *Store) OnOOM(f func(OOMEvent)) {
	s.oomHooks = append(s.oomHooks, f)
}

func (s *Store) notifyOOM(ev OOMEvent) {
	for _, f := range s.oomHooks {
		f(ev)
	}
}

type procEntry struct {
	// Set at creation, never changed.
	pid, uid  uint32
	startTime uint64
	// fed: the entry comes from Feed (a trusted source without a
	// connection), not from a socket peer.
	fed bool

	// Changed under the store's mu.
	disconnectedAt time.Time // when conns last fell to 0
	// conns is the number of open connections bound to the entry; changed
	// under the store's mu, read without it.
	conns atomic.Int32
	// removed is set under both the store's and the entry's mu; the server
	// reads it without either, to close the connections of removed
	// entries. A removed entry takes no message.
	removed atomic.Bool
	// exited: Prune found the process gone while a connection of it was
	// still open. The entry is out of the index (no reader sees it, and a
	// new process with the same pid gets an entry of its own), but its
	// connections still apply the lines the process queued before it
	// exited; the last one to close drops it (release). Set under both
	// the store's and the entry's mu.
	exited atomic.Bool

	// mu guards the fields below.
	mu               sync.Mutex
	framework        string
	frameworkVersion string
	client           string
	devices          []*deviceEntry // sorted by UUID
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

// counterState turns a client counter that may reset into one that never
// decreases: exported = base + raw, and base grows by the last raw value
// whenever raw goes down.
type counterState struct {
	seen    bool
	lastRaw uint64
	base    uint64
}

func (c *counterState) update(raw uint64) uint64 {
	if c.seen && raw < c.lastRaw {
		c.base = addSat(c.base, c.lastRaw)
	}
	c.seen = true
	c.lastRaw = raw
	return addSat(c.base, raw)
}

func addSat(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// NewStore returns an empty store with the default process limits. A
// process whose connections are all closed is removed by the first Prune
// at least ttl after the last one closed (ttl <= 0: the first Prune after
// it closed).
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

// SetProcessLimits sets how many socket peers may report at once, in all
// and per uid (<= 0: the default). A process over a limit has its messages
// rejected until another one goes. Call it before the store is used.
func (s *Store) SetProcessLimits(total, perUID int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if total <= 0 {
		total = DefaultMaxProcesses
	}
	if perUID <= 0 {
		perUID = DefaultMaxProcessesPerUID
	}
	s.maxProcesses, s.maxPerUID = total, perUID
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

// SetLinger sets how long the store keeps a process after it exited
// (Prune found it gone, or Remove): Processes lists it, with Exited set,
// until the first Prune at least d after it exited, so that a scrape sees
// the counters it reported last (an OOM raised right before it exited).
// 0 (the default) drops it at once. An exited socket peer counts against
// its uid's process caps until its linger ends, and only a new process of
// the same uid pushes it out early (see admitLocked): no user can push out
// another's. Exited fed processes are bounded by the process limit, the
// oldest going first. Call it before the store is used.
func (s *Store) SetLinger(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.linger = max(d, 0)
}

// lingerLocked keeps e, a process that exited at now, for the linger.
func (s *Store) lingerLocked(e *procEntry, now time.Time) {
	if s.linger <= 0 {
		return
	}
	var gone []goneEntry
	if g := s.gone.Load(); g != nil {
		gone = *g
	}
	next := make([]goneEntry, 0, len(gone)+1)
	if e.fed {
		// Fed processes have no uid caps: keep at most the process limit
		// of them, dropping the oldest.
		over := 1 - s.maxProcesses
		for _, g := range gone {
			if g.e.fed {
				over++
			}
		}
		for _, g := range gone {
			if over > 0 && g.e.fed {
				over--
				continue
			}
			next = append(next, g)
		}
	} else {
		next = append(next, gone...)
		s.nGone++
		s.gonePerUID[e.uid]++
	}
	next = append(next, goneEntry{e, now})
	s.gone.Store(&next)
	s.version.Add(1)
}

// forgetGoneLocked takes the socket peer g out of the lingering counts.
func (s *Store) forgetGoneLocked(g goneEntry) {
	if g.e.fed {
		return
	}
	s.nGone--
	if s.gonePerUID[g.e.uid]--; s.gonePerUID[g.e.uid] <= 0 {
		delete(s.gonePerUID, g.e.uid)
	}
}

// evictGoneLocked drops the oldest lingering process of uid, to make room
// for a new process of the same uid; false if uid has none.
func (s *Store) evictGoneLocked(uid uint32) bool {
	g := s.gone.Load()
	if g == nil || s.gonePerUID[uid] == 0 {
		return false
	}
	gone := *g
	for i, ge := range gone {
		if ge.e.fed || ge.e.uid != uid {
			continue
		}
		next := make([]goneEntry, 0, len(gone)-1)
		next = append(next, gone[:i]...)
		next = append(next, gone[i+1:]...)
		s.forgetGoneLocked(ge)
		s.gone.Store(&next)
		s.version.Add(1)
		return true
	}
	return false
}

// expireLocked forgets the exited processes whose linger has passed at
// now.
func (s *Store) expireLocked(now time.Time) {
	g := s.gone.Load()
	if g == nil || len(*g) == 0 {
		return
	}
	gone := *g
	i := 0
	for i < len(gone) && now.Sub(gone[i].at) >= s.linger {
		s.forgetGoneLocked(gone[i])
		i++
	}
	if i > 0 {
		next := append([]goneEntry(nil), gone[i:]...)
		s.gone.Store(&next)
		s.version.Add(1)
	}
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

// Prune is called once per NVML poll. It drops every process that alive
// says is gone (alive must answer true when it cannot tell), and
// every process whose connections have all been closed for at least the
// TTL. A gone process with a connection still open leaves the index at
// once (it is no longer exported, and its pid is free for a new entry),
// but its connections may still apply the lines it queued before it
// exited: the entry is dropped when the last of them closes. alive is
// called without the store's lock held; it may be nil.
func (s *Store) Prune(now time.Time, alive func(pid uint32, startTime uint64) bool) {
	var dead map[*procEntry]bool
	if alive != nil {
		for _, e := range s.sorted() {
			if !alive(e.pid, e.startTime) {
				if dead == nil {
					dead = make(map[*procEntry]bool)
				}
				dead[e] = true
			}
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	sorted := s.sorted()
	var kept []*procEntry
	for i, e := range sorted {
		expired := e.conns.Load() == 0 && now.Sub(e.disconnectedAt) >= s.ttl
		switch {
		case dead[e] && e.conns.Load() > 0:
			s.exitLocked(e)
			s.lingerLocked(e, now)
		case dead[e]:
			s.dropLocked(e)
			s.lingerLocked(e, now)
		case expired:
			s.dropLocked(e)
		default:
			if kept != nil {
				kept = append(kept, e)
			}
			continue
		}
		if kept == nil {
			kept = make([]*procEntry, i, len(sorted)-1)
			copy(kept, sorted[:i])
		}
	}
	if kept != nil {
		s.publishLocked(kept)
	}
	if alive != nil {
		s.prunedAt.Store(now.UnixNano())
	}
}

// Remove drops the process pid, which exited: it is kept for the linger
// (see SetLinger).
func (s *Store) Remove(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.procs[pid]; ok {
		s.dropLocked(e)
		s.removeSortedLocked(pid)
		s.lingerLocked(e, time.Now())
	}
}

// dropLocked forgets e for good (its connections are closed) but leaves
// the index to the caller.
func (s *Store) dropLocked(e *procEntry) {
	s.unindexLocked(e, &e.removed)
}

// exitLocked takes e, a process that exited with a connection still open,
// out of procs and the process counts, but lets its connections feed it
// until they close; the index is left to the caller.
func (s *Store) exitLocked(e *procEntry) {
	s.unindexLocked(e, &e.exited)
}

// unindexLocked sets flag (removed or exited) and takes e's devices out
// of the count in one hold of e.mu, so that a device added or dropped
// meanwhile is counted once; then it takes e out of procs and the process
// counts.
func (s *Store) unindexLocked(e *procEntry, flag *atomic.Bool) {
	e.mu.Lock()
	flag.Store(true)
	s.nDevices.Add(-int64(len(e.devices)))
	e.mu.Unlock()
	if s.procs[e.pid] == e {
		delete(s.procs, e.pid)
	}
	if !e.fed {
		s.nSocket--
		if s.perUID[e.uid]--; s.perUID[e.uid] <= 0 {
			delete(s.perUID, e.uid)
		}
	}
}

func sortedIndex(sorted []*procEntry, pid uint32) int {
	return sort.Search(len(sorted), func(i int) bool { return sorted[i].pid >= pid })
}

// removeSortedLocked publishes the index without pid.
func (s *Store) removeSortedLocked(pid uint32) {
	sorted := s.sorted()
	i := sortedIndex(sorted, pid)
	if i < len(sorted) && sorted[i].pid == pid {
		next := make([]*procEntry, 0, len(sorted)-1)
		next = append(next, sorted[:i]...)
		s.publishLocked(append(next, sorted[i+1:]...))
	}
}

// putLocked inserts e, replacing any entry of the same pid, and publishes
// the index.
func (s *Store) putLocked(e *procEntry) {
	if !e.fed {
		s.nSocket++
		s.perUID[e.uid]++
	}
	sorted := s.sorted()
	i := sortedIndex(sorted, e.pid)
	if old, ok := s.procs[e.pid]; ok {
		s.dropLocked(old)
		next := append([]*procEntry(nil), sorted...)
		next[i] = e
		s.procs[e.pid] = e
		s.publishLocked(next)
		return
	}
	s.procs[e.pid] = e
	next := make([]*procEntry, 0, len(sorted)+1)
	next = append(next, sorted[:i]...)
	next = append(next, e)
	s.publishLocked(append(next, sorted[i:]...))
}

// Identity is who sent a message: the pid and uid the kernel gives for a
// connection's peer, and the process's start time (clock ticks since boot,
// /proc/<pid>/stat field 22). A socket peer's start time is always known;
// only a fed identity may leave it 0 (unknown).
type Identity struct {
	PID, UID  uint32
	StartTime uint64
}

// sameProcess reports whether the entry describes the process id: the
// same pid, start time and uid. A fed entry's unknown start time (0)
// matches any.
func (e *procEntry) sameProcess(id Identity) bool {
	if e.pid != id.PID {
		return false
	}
	if e.fed {
		return e.startTime == id.StartTime || e.startTime == 0 || id.StartTime == 0
	}
	return e.startTime == id.StartTime && e.uid == id.UID
}

// bindLocked returns the entry a connection's first accepted message
// goes to. The caller has just confirmed that id is the live process of
// its pid.
//
// A connection binds at its first accepted message: to the entry of the
// same process if there is one (a reconnect within the TTL keeps its
// counters), else to a new entry. A new entry replaces an entry of another
// start time (a dead earlier holder of the pid: id is the live one) or a
// fed one; it never replaces the entry of the same process under another
// uid (errIdentityConflict), and it is refused over the process limits.
// Later messages of the connection go to the entry it bound to (see
// lockBound).
func (s *Store) bindLocked(id Identity) (*procEntry, error) {
	e, ok := s.procs[id.PID]
	switch {
	case ok && e.sameProcess(id) && !e.fed:
	case ok && !e.fed && e.startTime == id.StartTime:
		return nil, errIdentityConflict
	default:
		if ok && !e.fed {
			// A dead earlier holder of the pid (id is the live one): it
			// lingers like any process that exited, under its own identity.
			s.dropLocked(e)
			s.removeSortedLocked(e.pid)
			s.lingerLocked(e, time.Now())
			e = nil
		}
		if err := s.admitLocked(id, e); err != nil {
			return nil, err
		}
		e = &procEntry{pid: id.PID, uid: id.UID, startTime: id.StartTime}
		s.putLocked(e)
	}
	e.conns.Add(1)
	return e, nil
}

// lockBound locks the entry a connection bound to, for one of its
// messages; it fails with errProcessGone, unlocked, when the entry was
// removed (pruned after its connections closed, replaced or dropped): the
// connection is then closed and its client reconnects. An exited entry
// (see procEntry.exited) still takes its connections' messages.
func lockBound(e *procEntry) error {
	e.mu.Lock()
	if e.removed.Load() {
		e.mu.Unlock()
		return errProcessGone
	}
	return nil
}

// admitLocked checks the process limits for a new socket entry of id that
// would replace old (nil if none). Processes that exited and linger count
// like live ones; over a limit, the oldest lingering process of id's own
// uid makes room, never another uid's.
func (s *Store) admitLocked(id Identity, old *procEntry) error {
	for {
		total, mine := s.nSocket+s.nGone, s.perUID[id.UID]+s.gonePerUID[id.UID]
		if old != nil && !old.fed {
			total--
			if old.uid == id.UID {
				mine--
			}
		}
		if total < s.maxProcesses && mine < s.maxPerUID {
			return nil
		}
		if s.evictGoneLocked(id.UID) {
			continue
		}
		if total >= s.maxProcesses {
			return fmt.Errorf("%w: the limit is %d (--allocstats.max-processes)", errTooManyProcesses, s.maxProcesses)
		}
		return fmt.Errorf("%w: uid %d has %d, the limit (--allocstats.max-processes-per-uid)", errTooManyProcessesForUID, id.UID, mine)
	}
}

// release is called when a connection bound to e closes. The last
// connection of an exited process drops its entry: every line the process
// queued has been read.
func (s *Store) release(e *procEntry, now time.Time) {
	if e == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.conns.Add(-1) <= 0 {
		e.conns.Store(0)
		e.disconnectedAt = now
		if e.exited.Load() {
			e.mu.Lock()
			e.removed.Store(true)
			e.mu.Unlock()
		}
	}
}

// hello records a hello message of a connection and returns its entry.
func (s *Store) hello(bound *procEntry, id Identity, h wire.Hello) (*procEntry, error) {
	if bound != nil {
		if err := lockBound(bound); err != nil {
			return bound, err
		}
		bound.framework, bound.frameworkVersion, bound.client = h.Framework, h.FrameworkVersion, h.Client
		bound.mu.Unlock()
		s.version.Add(1)
		return bound, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.bindLocked(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.framework, e.frameworkVersion, e.client = h.Framework, h.FrameworkVersion, h.Client
	e.mu.Unlock()
	s.version.Add(1)
	return e, nil
}

// stats applies a validated stats message of a connection. A connection's
// later messages lock only its process's entry; its first one (bound nil)
// takes the store's lock to find or create the entry.
func (s *Store) stats(bound *procEntry, id Identity, devices []DeviceReport, now time.Time, maxDevices int) (*procEntry, error) {
	if bound != nil {
		if err := lockBound(bound); err != nil {
			return bound, err
		}
		defer bound.mu.Unlock()
		if err := bound.checkCapLocked(devices, maxDevices); err != nil {
			return bound, err
		}
		s.applyLocked(bound, devices, now)
		return bound, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewCapLocked(id, devices, maxDevices); err != nil {
		return nil, err
	}
	e, err := s.bindLocked(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	s.applyLocked(e, devices, now)
	e.mu.Unlock()
	return e, nil
}

// checkNewCapLocked is checkCapLocked for a connection not bound yet: on
// the entry of the same process if there is one (it would bind to it).
func (s *Store) checkNewCapLocked(id Identity, devices []DeviceReport, maxDevices int) error {
	if cur, ok := s.procs[id.PID]; ok && cur.sameProcess(id) && !cur.fed {
		cur.mu.Lock()
		defer cur.mu.Unlock()
		return cur.checkCapLocked(devices, maxDevices)
	}
	return (*procEntry)(nil).checkCapLocked(devices, maxDevices)
}

// checkCapLocked fails when applying devices would give the process of e
// (nil: a new one) more than maxDevices devices, without changing
// anything. The caller holds e.mu.
func (e *procEntry) checkCapLocked(devices []DeviceReport, maxDevices int) error {
	if maxDevices <= 0 {
		return nil
	}
	n := 0
	if e != nil {
		n = len(e.devices)
	}
	for _, d := range devices {
		if e == nil || e.device(d.UUID) == nil {
			n++
		}
	}
	if n > maxDevices {
		return fmt.Errorf("the process would report %d devices, the limit is %d", n, maxDevices)
	}
	return nil
}

// applyLocked applies devices to e; the caller holds e.mu.
func (s *Store) applyLocked(e *procEntry, devices []DeviceReport, now time.Time) {
	for _, r := range devices {
		s.deviceLocked(e, r.UUID).apply(r, now)
	}
	// Raised under e.mu, which a reader's copy of e waits for.
	s.version.Add(1)
}

// apply records a client's report r of the device, received at now: the
// one place where what a client said (DeviceReport) becomes what the store
// keeps (DeviceStats). They are two types because the store keeps more
// than a report says and not all of it as said: counters that never
// decrease where the client's may reset, the floor of active memory over
// the reports, the last OOM, when the device was last named.
func (d *deviceEntry) apply(r DeviceReport, now time.Time) {
	st := &d.stats
	st.HasStats = true
	st.Reserved = r.Reserved
	st.Active = r.Active
	st.Allocated = r.Allocated
	st.InactiveSplit = r.InactiveSplit
	st.PeakReserved = r.PeakReserved
	st.PeakActive = r.PeakActive
	st.Limit = r.Limit
	// The floor goes with active: a report without active exports
	// neither.
	st.ActiveFloor = Optional{}
	if r.Active.OK {
		at := r.At
		if at.IsZero() {
			at = now
		}
		d.floor.Observe(at, r.Active.V)
		if v, ok := d.floor.Floor(); ok {
			st.ActiveFloor = Some(v)
		}
	}
	st.AllocRetries = d.retries.apply(r.AllocRetries)
	st.OOMs = d.ooms.apply(r.OOMs)
	st.LastReport = now
}

func (c *counterState) apply(raw Optional) Optional {
	if !raw.OK {
		return Optional{}
	}
	return Some(c.update(raw.V))
}

// device returns the entry's device uuid, or nil. The caller holds e.mu.
func (e *procEntry) device(uuid string) *deviceEntry {
	i := sort.Search(len(e.devices), func(i int) bool { return e.devices[i].stats.UUID >= uuid })
	if i < len(e.devices) && e.devices[i].stats.UUID == uuid {
		return e.devices[i]
	}
	return nil
}

// deviceLocked returns the entry's device uuid, creating it if absent. The
// caller holds e.mu.
func (s *Store) deviceLocked(e *procEntry, uuid string) *deviceEntry {
	i := sort.Search(len(e.devices), func(i int) bool { return e.devices[i].stats.UUID >= uuid })
	if i < len(e.devices) && e.devices[i].stats.UUID == uuid {
		return e.devices[i]
	}
	d := &deviceEntry{stats: DeviceStats{UUID: uuid}}
	e.devices = append(e.devices, nil)
	copy(e.devices[i+1:], e.devices[i:])
	e.devices[i] = d
	if !e.removed.Load() && !e.exited.Load() {
		s.nDevices.Add(1)
	}
	return d
}

// DropUnlisted is called once per NVML poll. listed says whether NVML lists
// the process pid on the device uuid (it must answer true when it cannot
// tell, and must not call the store). The state of a socket peer on a
// device where NVML does not list it is kept for grace, then dropped: a
// process reports only devices it uses, and NVML lists a process on every
// device where it holds a context, so a report NVML never confirms is
// either a process NVML cannot see or a made-up device, and neither may
// hold series for long. The process's entry stays (a later message may
// name the device again). Like Processes, it locks one entry at a time.
func (s *Store) DropUnlisted(now time.Time, grace time.Duration, listed func(pid uint32, uuid string) bool) {
	for _, e := range s.sorted() {
		if e.fed {
			continue
		}
		e.mu.Lock()
		kept := e.devices[:0]
		for _, d := range e.devices {
			switch {
			case listed(e.pid, d.stats.UUID):
				d.unlistedSince = time.Time{}
			case d.unlistedSince.IsZero():
				d.unlistedSince = now
			case now.Sub(d.unlistedSince) >= grace:
				if !e.removed.Load() && !e.exited.Load() {
					s.nDevices.Add(-1)
				}
				continue
			}
			kept = append(kept, d)
		}
		dropped := len(e.devices) - len(kept)
		clear(e.devices[len(kept):])
		e.devices = kept
		e.mu.Unlock()
		if dropped > 0 {
			s.version.Add(1)
		}
	}
}

// oom records an oom message of a connection.
func (s *Store) oom(bound *procEntry, id Identity, m OOMMessage, now time.Time, maxDevices int, reply func([]byte)) (*procEntry, OOMEvent, error) {
	devices := []DeviceReport{{UUID: m.UUID}}
	e := bound
	if e != nil {
		if err := lockBound(e); err != nil {
			return bound, OOMEvent{}, err
		}
		if err := e.checkCapLocked(devices, maxDevices); err != nil {
			e.mu.Unlock()
			return bound, OOMEvent{}, err
		}
	} else {
		s.mu.Lock()
		if err := s.checkNewCapLocked(id, devices, maxDevices); err != nil {
			s.mu.Unlock()
			return nil, OOMEvent{}, err
		}
		var err error
		if e, err = s.bindLocked(id); err != nil {
			s.mu.Unlock()
			return nil, OOMEvent{}, err
		}
		e.mu.Lock()
		s.mu.Unlock()
	}
	ev := s.recordOOMLocked(e, m, now)
	e.mu.Unlock()
	ev.Reply = reply
	s.notifyOOM(ev)
	return e, ev, nil
}

// recordOOMLocked records m in e; the caller holds e.mu.
func (s *Store) recordOOMLocked(e *procEntry, m OOMMessage, now time.Time) OOMEvent {
	d := s.deviceLocked(e, m.UUID)
	d.stats.LastOOMRequest = Some(m.RequestedBytes)
	d.stats.LastOOMTime = now
	d.stats.LastReport = now
	s.version.Add(1)
	return OOMEvent{
		Time:      now,
		PID:       e.pid,
		UID:       e.uid,
		StartTime: e.startTime,
		UUID:      m.UUID,
		Requested: m.RequestedBytes,
		Limit:     m.LimitBytes,
		Free:      m.FreeBytes,
		Stats:     d.stats,
	}
}

// Feed applies a stats message from a process that reports without a
// connection (the simulated node), as if it came over the socket from id.
// Its entry is kept for the TTL after the last Feed, or until Remove or
// Prune finds the process gone. framework, if not empty, is recorded as a
// hello would.
func (s *Store) Feed(id Identity, framework string, devices []DeviceReport, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewCapLocked(id, devices, DefaultMaxDevices); err != nil {
		return err
	}
	e := s.feedEntryLocked(id, now)
	e.mu.Lock()
	defer e.mu.Unlock()
	if framework != "" {
		e.framework = wire.Sanitize(framework)
	}
	s.applyLocked(e, devices, now)
	return nil
}

// FeedOOM records an oom message of a process that reports without a
// connection, as Feed does for stats.
func (s *Store) FeedOOM(id Identity, m OOMMessage, now time.Time) (OOMEvent, error) {
	s.mu.Lock()
	if err := s.checkNewCapLocked(id, []DeviceReport{{UUID: m.UUID}}, DefaultMaxDevices); err != nil {
		s.mu.Unlock()
		return OOMEvent{}, err
	}
	e := s.feedEntryLocked(id, now)
	e.mu.Lock()
	ev := s.recordOOMLocked(e, m, now)
	e.mu.Unlock()
	s.mu.Unlock()
	s.notifyOOM(ev)
	return ev, nil
}

// feedEntryLocked returns the entry of id, created (replacing one of an
// earlier holder of the pid) if needed, with its TTL restarted at now.
func (s *Store) feedEntryLocked(id Identity, now time.Time) *procEntry {
	e, ok := s.procs[id.PID]
	if !ok || !e.sameProcess(id) || !e.fed {
		e = &procEntry{pid: id.PID, uid: id.UID, startTime: id.StartTime, fed: true}
		s.putLocked(e)
	}
	if e.conns.Load() == 0 {
		e.disconnectedAt = now
	}
	return e
}
