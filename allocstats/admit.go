package allocstats

// Which entry a session's messages go to, and the caps on processes
// and devices that a new entry or device must fit.

import (
	"errors"
	"fmt"
	"time"
)

// Errors of the store's admission rules.
var (
	// errProcessGone: the session's process entry was removed (pruned,
	// replaced or dropped); the socket server closes the connection, and
	// its client reconnects.
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

// SetProcessLimits sets how many processes may report at once, in all and
// per uid (<= 0: the default), whatever their source. A process over a limit has its messages
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

// bindLocked returns the entry a session's first accepted message goes
// to. The session's source vouches that id is the live process of its pid
// (the socket server has just checked).
//
// A session binds at its first accepted message: to the entry of the same
// process if there is one (a reconnect within the TTL keeps its counters),
// else to a new entry. A new entry replaces an entry of another start time
// (a dead earlier holder of the pid: id is the live one); it never
// replaces the entry of the same process under another uid
// (errIdentityConflict), and it is refused over the process limits. Later
// messages of the session go to the entry it bound to (see lockBound).
func (s *Store) bindLocked(id Identity) (*procEntry, error) {
	e, ok := s.procs[id.PID]
	switch {
	case ok && e.sameProcess(id):
	case ok && e.startTime == id.StartTime:
		return nil, errIdentityConflict
	default:
		if ok {
			// A dead earlier holder of the pid (id is the live one): it
			// lingers like any process that exited, under its own identity.
			s.dropLocked(e)
			s.removeSortedLocked(e.pid)
			s.lingerLocked(e, time.Now())
			e = nil
		}
		if err := s.admitLocked(id); err != nil {
			return nil, err
		}
		e = &procEntry{pid: id.PID, uid: id.UID, startTime: id.StartTime}
		s.putLocked(e)
	}
	e.conns.Add(1)
	return e, nil
}

// lockBound locks the entry a session bound to, for one of its messages;
// it fails with errProcessGone, unlocked, when the entry was removed
// (pruned after its sessions closed, replaced or dropped): the socket
// server then closes the connection and its client reconnects. An exited
// entry (see procEntry.exited) still takes its sessions' messages.
func lockBound(e *procEntry) error {
	e.mu.Lock()
	if e.removed.Load() {
		e.mu.Unlock()
		return errProcessGone
	}
	return nil
}

// admitLocked checks the process limits for a new entry of id. Processes
// that exited and linger count like live ones; over a limit, the oldest
// lingering process of id's own uid makes room, never another uid's.
func (s *Store) admitLocked(id Identity) error {
	for {
		total, mine := s.nProcs+s.nGone, s.perUID[id.UID]+s.gonePerUID[id.UID]
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

// release is called when a session bound to e closes. The last session of
// an exited process drops its entry: every line the process queued has
// been read.
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

// checkNewCapLocked is checkCapLocked for a session not bound yet: on
// the entry of the same process if there is one (it would bind to it).
func (s *Store) checkNewCapLocked(id Identity, devices []DeviceReport, maxDevices int) error {
	if cur, ok := s.procs[id.PID]; ok && cur.sameProcess(id) {
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
