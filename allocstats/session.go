package allocstats

// Sessions: the store's one input. Each source of allocator reports (a
// connection of the socket, a simulated process) holds one session per
// client.

import (
	"errors"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
)

// errSessionClosed: a message came through a session after its Close.
var errSessionClosed = errors.New("the session is closed")

// Session is one client of the store: the messages of one process, applied
// in the order they came, as one connection of the socket applies them.
// The socket server opens one per connection; the simulated node one per
// simulated process, from its first report to its exit.
//
// A session binds to its process's entry at its first accepted message:
// to the entry of the same process if there is one (a reconnect within
// the TTL keeps its counters), else to a new one, if the process limits
// (SetProcessLimits) leave room; a message refused for the limits leaves
// the session unbound, and a later one tries again. While a session is
// open the process is connected and outlives the TTL; after the last of
// its sessions closes, the first Prune at least the TTL later drops it,
// or Prune finds it gone and keeps it for the linger (SetLinger).
//
// A session checks neither who its client is nor what devices it names:
// its source does (the socket server takes the identity from the kernel,
// and a device from NVML's list, spelled as NVML spells it). A Session is
// used by one goroutine at a time.
type Session struct {
	store      *Store
	id         Identity
	maxDevices int
	entry      *procEntry // nil before the first accepted message
	closed     bool
	// listener, when set, takes the daemon's messages to the client
	// (Store.Send): set before the first message.
	listener Replier
}

// Open starts a session of the process id, whose reports may name at most
// maxDevices devices in all (<= 0: DefaultMaxDevices). It changes nothing
// in the store until the session's first message.
func (s *Store) Open(id Identity, maxDevices int) *Session {
	if maxDevices <= 0 {
		maxDevices = DefaultMaxDevices
	}
	return &Session{store: s, id: id, maxDevices: maxDevices}
}

// Hello records the client's framework, its version and the client
// library (sanitised: printable ASCII, at most 64 characters each).
func (ss *Session) Hello(h Hello) error {
	if ss.closed {
		return errSessionClosed
	}
	h = Hello{Framework: wire.Sanitize(h.Framework), FrameworkVersion: wire.Sanitize(h.FrameworkVersion), Client: wire.Sanitize(h.Client), WarnBefore: h.WarnBefore}
	return ss.bind(ss.store.hello(ss.entry, ss.id, h))
}

// Stats applies a stats message received at now: the process's allocator
// state on each device it names. The message is refused whole when the
// process would name more than the session's devices.
func (ss *Session) Stats(devices []DeviceReport, now time.Time) error {
	if ss.closed {
		return errSessionClosed
	}
	if err := ss.bind(ss.store.stats(ss.entry, ss.id, devices, now, ss.maxDevices)); err != nil {
		return err
	}
	ss.store.notifySamples(ss.id, devices, now)
	return nil
}

// OOM records an oom message received at now and hands the event to the
// store's OOM observers; replyTo, if not nil, goes with it (the client
// that the verdict answers, OOMEvent.ReplyTo).
func (ss *Session) OOM(m OOMMessage, now time.Time, replyTo Replier) (OOMEvent, error) {
	if ss.closed {
		return OOMEvent{}, errSessionClosed
	}
	e, ev, err := ss.store.oom(ss.entry, ss.id, m, now, ss.maxDevices, replyTo)
	return ev, ss.bind(e, err)
}

// Listen makes r the way the daemon's messages reach this session's
// client (a warning, Store.Send), from the session's first accepted
// message until Close. r is called from the sender's goroutine. Call it
// before the session's first message.
func (ss *Session) Listen(r Replier) { ss.listener = r }

// Close ends the session: the client went away at now. The process stays
// connected while another of its sessions is open; after the last one,
// the TTL runs from now. Close is idempotent; a closed session takes no
// message.
func (ss *Session) Close(now time.Time) {
	if ss.closed {
		return
	}
	ss.closed = true
	ss.unlisten()
	ss.store.release(ss.entry, now)
}

// bind records the entry a store call returned, and puts the session
// among the entry's listeners where it listens.
func (ss *Session) bind(e *procEntry, err error) error {
	if err != nil || e == ss.entry {
		return err
	}
	ss.unlisten()
	ss.entry = e
	if ss.listener != nil && e != nil {
		e.mu.Lock()
		e.listeners = append(e.listeners, ss)
		e.mu.Unlock()
	}
	return nil
}

// unlisten takes the session out of its entry's listeners.
func (ss *Session) unlisten() {
	e := ss.entry
	if e == nil || ss.listener == nil {
		return
	}
	e.mu.Lock()
	for i, l := range e.listeners {
		if l == ss {
			e.listeners = append(e.listeners[:i:i], e.listeners[i+1:]...)
			break
		}
	}
	e.mu.Unlock()
}

// Send hands line to every open session of the process pid that started
// at start (0: whichever runs under pid) that listens, and says to how
// many. A process that exited, or that no session of which listens, gets
// nothing.
func (s *Store) Send(pid uint32, start uint64, line []byte) int {
	sorted := s.sorted()
	i := sortedIndex(sorted, pid)
	if i == len(sorted) || sorted[i].pid != pid {
		return 0
	}
	e := sorted[i]
	if start != 0 && e.startTime != start {
		return 0
	}
	e.mu.Lock()
	rs := make([]Replier, 0, len(e.listeners))
	for _, l := range e.listeners {
		rs = append(rs, l.listener)
	}
	e.mu.Unlock()
	for _, r := range rs {
		r.Reply(line)
	}
	return len(rs)
}
