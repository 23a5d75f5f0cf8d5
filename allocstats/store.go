package allocstats

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// DeviceStats is the allocator state of one process on one device.
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
	Devices          []DeviceStats
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
// that report over the socket (maxPerUID of one uid), each with at most
// the devices-per-process cap; fed processes are bounded by their source.
type Store struct {
	ttl          time.Duration
	maxProcesses int
	maxPerUID    int

	mu    sync.RWMutex
	procs map[uint32]*procEntry
	// sorted holds the entries of procs ordered by pid, so that Processes
	// costs no sort.
	sorted []*procEntry
	// nDevices is the number of device entries over all processes.
	nDevices int
	// nSocket and perUID count the entries of socket peers (not fed).
	nSocket int
	perUID  map[uint32]int

	oomHooks []func(OOMEvent) // set before use, read without the lock
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
	pid, uid  uint32
	startTime uint64
	// fed: the entry comes from Feed (a trusted source without a
	// connection), not from a socket peer.
	fed              bool
	framework        string
	frameworkVersion string
	client           string
	conns            int       // open connections bound to the entry
	disconnectedAt   time.Time // when conns last fell to 0
	// removed is set under the store's lock; the server reads it without,
	// to close the connections of removed entries.
	removed atomic.Bool
	devices []*deviceEntry // sorted by UUID
}

type deviceEntry struct {
	stats   DeviceStats
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
// its devices sorted by UUID.
func (s *Store) Processes() []Process {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Process, len(s.sorted))
	// One backing array for all devices: two allocations in all.
	all := make([]DeviceStats, 0, s.nDevices)
	for i, e := range s.sorted {
		start := len(all)
		for _, d := range e.devices {
			all = append(all, d.stats)
		}
		out[i] = e.snapshot(all[start:len(all):len(all)])
	}
	return out
}

// Process returns a copy of one process.
func (s *Store) Process(pid uint32) (Process, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.procs[pid]
	if !ok {
		return Process{}, false
	}
	devs := make([]DeviceStats, len(e.devices))
	for i, d := range e.devices {
		devs[i] = d.stats
	}
	return e.snapshot(devs), true
}

func (e *procEntry) snapshot(devs []DeviceStats) Process {
	return Process{
		PID:              e.pid,
		UID:              e.uid,
		StartTime:        e.startTime,
		Framework:        e.framework,
		FrameworkVersion: e.frameworkVersion,
		Client:           e.client,
		Connected:        e.conns > 0,
		Devices:          devs,
	}
}

// PIDs returns the pids of every process in the store, sorted.
func (s *Store) PIDs() []uint32 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pids := make([]uint32, len(s.sorted))
	for i, e := range s.sorted {
		pids[i] = e.pid
	}
	return pids
}

// Prune is called once per NVML poll. It drops every process that alive
// says is gone (alive must answer true when it cannot tell), and
// every process whose connections have all been closed for at least the
// TTL. alive is called without the store's lock held; it may be nil.
func (s *Store) Prune(now time.Time, alive func(pid uint32, startTime uint64) bool) {
	type candidate struct {
		e     *procEntry
		pid   uint32
		start uint64
	}
	var check []candidate
	if alive != nil {
		s.mu.RLock()
		check = make([]candidate, 0, len(s.sorted))
		for _, e := range s.sorted {
			check = append(check, candidate{e, e.pid, e.startTime})
		}
		s.mu.RUnlock()
	}
	dead := make(map[*procEntry]bool)
	for _, c := range check {
		if !alive(c.pid, c.start) {
			dead[c.e] = true
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.sorted[:0]
	for _, e := range s.sorted {
		expired := e.conns == 0 && now.Sub(e.disconnectedAt) >= s.ttl
		if dead[e] || expired {
			s.dropLocked(e)
			continue
		}
		kept = append(kept, e)
	}
	clear(s.sorted[len(kept):])
	s.sorted = kept
}

// Remove drops the process pid.
func (s *Store) Remove(pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.procs[pid]; ok {
		s.dropLocked(e)
		s.removeSortedLocked(pid)
	}
}

// dropLocked forgets e but leaves s.sorted to the caller.
func (s *Store) dropLocked(e *procEntry) {
	e.removed.Store(true)
	s.nDevices -= len(e.devices)
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

func (s *Store) sortedIndexLocked(pid uint32) int {
	return sort.Search(len(s.sorted), func(i int) bool { return s.sorted[i].pid >= pid })
}

func (s *Store) removeSortedLocked(pid uint32) {
	i := s.sortedIndexLocked(pid)
	if i < len(s.sorted) && s.sorted[i].pid == pid {
		copy(s.sorted[i:], s.sorted[i+1:])
		s.sorted[len(s.sorted)-1] = nil
		s.sorted = s.sorted[:len(s.sorted)-1]
	}
}

// putLocked inserts e, replacing any entry of the same pid.
func (s *Store) putLocked(e *procEntry) {
	if !e.fed {
		s.nSocket++
		s.perUID[e.uid]++
	}
	if old, ok := s.procs[e.pid]; ok {
		s.dropLocked(old)
		i := s.sortedIndexLocked(e.pid)
		s.sorted[i] = e
		s.procs[e.pid] = e
		return
	}
	s.procs[e.pid] = e
	i := s.sortedIndexLocked(e.pid)
	s.sorted = append(s.sorted, nil)
	copy(s.sorted[i+1:], s.sorted[i:])
	s.sorted[i] = e
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

// bindLocked returns the entry a connection's message goes to. bound is the
// entry the connection bound to before (nil at first). The caller has just
// confirmed that id is the live process of its pid.
//
// A connection binds at its first accepted message: to the entry of the
// same process if there is one (a reconnect within the TTL keeps its
// counters), else to a new entry. A new entry replaces an entry of another
// start time (a dead earlier holder of the pid: id is the live one) or a
// fed one; it never replaces the entry of the same process under another
// uid (errIdentityConflict), and it is refused over the process limits. A
// connection whose entry was removed since gets errProcessGone.
func (s *Store) bindLocked(bound *procEntry, id Identity) (*procEntry, error) {
	if bound != nil {
		if bound.removed.Load() {
			return nil, errProcessGone
		}
		return bound, nil
	}
	e, ok := s.procs[id.PID]
	switch {
	case ok && e.sameProcess(id) && !e.fed:
	case ok && !e.fed && e.startTime == id.StartTime:
		return nil, errIdentityConflict
	default:
		if err := s.admitLocked(id, e); err != nil {
			return nil, err
		}
		e = &procEntry{pid: id.PID, uid: id.UID, startTime: id.StartTime}
		s.putLocked(e)
	}
	e.conns++
	return e, nil
}

// admitLocked checks the process limits for a new socket entry of id that
// would replace old (nil if none).
func (s *Store) admitLocked(id Identity, old *procEntry) error {
	total, mine := s.nSocket, s.perUID[id.UID]
	if old != nil && !old.fed {
		total--
		if old.uid == id.UID {
			mine--
		}
	}
	if total >= s.maxProcesses {
		return fmt.Errorf("%w: the limit is %d (--allocstats.max-processes)", errTooManyProcesses, s.maxProcesses)
	}
	if mine >= s.maxPerUID {
		return fmt.Errorf("%w: uid %d has %d, the limit (--allocstats.max-processes-per-uid)", errTooManyProcessesForUID, id.UID, mine)
	}
	return nil
}

// release is called when a connection bound to e closes.
func (s *Store) release(e *procEntry, now time.Time) {
	if e == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e.conns--
	if e.conns <= 0 {
		e.conns = 0
		e.disconnectedAt = now
	}
}

// hello records a hello message of a connection and returns its entry.
func (s *Store) hello(bound *procEntry, id Identity, h Hello) (*procEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.bindLocked(bound, id)
	if err != nil {
		return bound, err
	}
	e.framework, e.frameworkVersion, e.client = h.Framework, h.FrameworkVersion, h.Client
	return e, nil
}

// stats applies a validated stats message of a connection.
func (s *Store) stats(bound *procEntry, id Identity, devices []DeviceReport, now time.Time, maxDevices int) (*procEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkCapLocked(bound, id, devices, maxDevices); err != nil {
		return bound, err
	}
	e, err := s.bindLocked(bound, id)
	if err != nil {
		return bound, err
	}
	s.applyLocked(e, devices, now)
	return e, nil
}

// checkCapLocked fails when applying devices would give the process more
// than maxDevices devices, without changing anything.
func (s *Store) checkCapLocked(bound *procEntry, id Identity, devices []DeviceReport, maxDevices int) error {
	if maxDevices <= 0 {
		return nil
	}
	e := bound
	if e == nil {
		if cur, ok := s.procs[id.PID]; ok && cur.sameProcess(id) && !cur.fed {
			e = cur
		}
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

func (s *Store) applyLocked(e *procEntry, devices []DeviceReport, now time.Time) {
	for _, r := range devices {
		d := s.deviceLocked(e, r.UUID)
		st := &d.stats
		st.HasStats = true
		st.Reserved = r.Reserved
		st.Active = r.Active
		st.Allocated = r.Allocated
		st.InactiveSplit = r.InactiveSplit
		st.PeakReserved = r.PeakReserved
		st.PeakActive = r.PeakActive
		st.Limit = r.Limit
		st.AllocRetries = d.retries.apply(r.AllocRetries)
		st.OOMs = d.ooms.apply(r.OOMs)
		st.LastReport = now
	}
}

func (c *counterState) apply(raw Optional) Optional {
	if !raw.OK {
		return Optional{}
	}
	return Some(c.update(raw.V))
}

// device returns the entry's device uuid, or nil.
func (e *procEntry) device(uuid string) *deviceEntry {
	i := sort.Search(len(e.devices), func(i int) bool { return e.devices[i].stats.UUID >= uuid })
	if i < len(e.devices) && e.devices[i].stats.UUID == uuid {
		return e.devices[i]
	}
	return nil
}

// deviceLocked returns the entry's device uuid, creating it if absent.
func (s *Store) deviceLocked(e *procEntry, uuid string) *deviceEntry {
	i := sort.Search(len(e.devices), func(i int) bool { return e.devices[i].stats.UUID >= uuid })
	if i < len(e.devices) && e.devices[i].stats.UUID == uuid {
		return e.devices[i]
	}
	d := &deviceEntry{stats: DeviceStats{UUID: uuid}}
	e.devices = append(e.devices, nil)
	copy(e.devices[i+1:], e.devices[i:])
	e.devices[i] = d
	if !e.removed.Load() {
		s.nDevices++
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
// name the device again).
func (s *Store) DropUnlisted(now time.Time, grace time.Duration, listed func(pid uint32, uuid string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.sorted {
		if e.fed {
			continue
		}
		kept := e.devices[:0]
		for _, d := range e.devices {
			switch {
			case listed(e.pid, d.stats.UUID):
				d.unlistedSince = time.Time{}
			case d.unlistedSince.IsZero():
				d.unlistedSince = now
			case now.Sub(d.unlistedSince) >= grace:
				s.nDevices--
				continue
			}
			kept = append(kept, d)
		}
		clear(e.devices[len(kept):])
		e.devices = kept
	}
}

// oom records an oom message of a connection.
func (s *Store) oom(bound *procEntry, id Identity, m OOMMessage, now time.Time, maxDevices int) (*procEntry, OOMEvent, error) {
	s.mu.Lock()
	if err := s.checkCapLocked(bound, id, []DeviceReport{{UUID: m.UUID}}, maxDevices); err != nil {
		s.mu.Unlock()
		return bound, OOMEvent{}, err
	}
	e, err := s.bindLocked(bound, id)
	if err != nil {
		s.mu.Unlock()
		return bound, OOMEvent{}, err
	}
	ev := s.recordOOMLocked(e, m, now)
	s.mu.Unlock()
	s.notifyOOM(ev)
	return e, ev, nil
}

func (s *Store) recordOOMLocked(e *procEntry, m OOMMessage, now time.Time) OOMEvent {
	d := s.deviceLocked(e, m.UUID)
	d.stats.LastOOMRequest = Some(m.RequestedBytes)
	d.stats.LastOOMTime = now
	d.stats.LastReport = now
	return OOMEvent{
		Time:      now,
		PID:       e.pid,
		UID:       e.uid,
		StartTime: e.startTime,
		UUID:      m.UUID,
		Requested: m.RequestedBytes,
		Limit:     m.LimitBytes,
		Free:      m.FreeBytes,
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
	if err := s.checkCapLocked(nil, id, devices, DefaultMaxDevices); err != nil {
		return err
	}
	e := s.feedEntryLocked(id, now)
	if framework != "" {
		e.framework = Sanitize(framework)
	}
	s.applyLocked(e, devices, now)
	return nil
}

// FeedOOM records an oom message of a process that reports without a
// connection, as Feed does for stats.
func (s *Store) FeedOOM(id Identity, m OOMMessage, now time.Time) (OOMEvent, error) {
	s.mu.Lock()
	if err := s.checkCapLocked(nil, id, []DeviceReport{{UUID: m.UUID}}, DefaultMaxDevices); err != nil {
		s.mu.Unlock()
		return OOMEvent{}, err
	}
	ev := s.recordOOMLocked(s.feedEntryLocked(id, now), m, now)
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
	if e.conns == 0 {
		e.disconnectedAt = now
	}
	return e
}
