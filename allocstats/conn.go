package allocstats

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"io"
	"os"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
)

// welcome is the daemon's answer to the first hello of a connection.
type welcome struct {
	V          int    `json:"v"`
	Type       string `json:"type"`
	IntervalMS int64  `json:"interval_ms"`
	Server     string `json:"server"`
	// OOMVerdict: the daemon answers an oom message with a verdict
	// message, so a client may wait for it before its process exits.
	OOMVerdict bool `json:"oom_verdict,omitempty"`
	// WarnBeforeSeconds: the daemon sends a warning message when it
	// foresees the process running out of memory within this many
	// seconds (unless the client asked for another threshold in its
	// hello); absent: it sends none.
	WarnBeforeSeconds *float64 `json:"warn_before_seconds,omitempty"`
}

// deadlineSlack is how far the read deadline may lag behind the idle
// timeout from the last accepted message before it is moved (see serve).
const deadlineSlack = time.Second

// connection is the state of one client connection, owned by its goroutine.
type connection struct {
	s      *Server
	cs     *connState
	peer   *peer
	logger log.Logger
	// session is the connection's input to the store.
	session  *Session
	welcomed bool
	// writeMu serialises writes: see write.
	writeMu sync.Mutex
	// lr reads the connection; aliveAt is lr.reads when the process was
	// last found alive: the lines of that read and earlier ones were all
	// written while it ran.
	lr      *lineReader
	aliveAt uint64
	// draining: the process exited and the other end of the connection is
	// closed; the lines still queued are applied until EOF.
	draining bool
	// lastMessage is when the last message was accepted (or the connection
	// opened): the idle timeout counts from it, so blank lines, bad lines
	// and a trickle of bytes do not keep a connection open.
	lastMessage time.Time
}

// errClose: handleLine asks to close the connection.
type errClose struct {
	reason string
	err    error
}

func (e *errClose) Error() string { return e.err.Error() }
func (e *errClose) Unwrap() error { return e.err }

// handle runs one connection until it closes.
func (s *Server) handle(cs *connState, acceptedAt time.Duration) {
	defer s.untrack(cs)
	p, err := s.identify(cs.c, acceptedAt)
	if err != nil {
		reason := rejectPeerCred
		if errors.Is(err, errPeerGone) {
			reason = rejectPeerGone
		}
		s.connectionsRejected.WithLabelValues(reason).Inc()
		s.warnRefused.Warn(s.logger).Log("msg", "Refusing an allocstats connection whose process cannot be identified", "reason", reason, "err", err)
		return
	}
	if err := s.admit(cs, p); err != nil {
		p.close()
		s.connectionsRejected.WithLabelValues(rejectMaxConnectionsPerUID).Inc()
		s.warnLimit.Warn(s.logger).Log("msg", "Connection limit of a uid reached, closing new allocstats connection",
			"pid", p.id.PID, "uid", p.id.UID, "limit", s.cfg.MaxConnectionsPerUID)
		return
	}
	conn := &connection{
		s:           s,
		cs:          cs,
		peer:        p,
		logger:      log.With(s.logger, "pid", p.id.PID, "uid", p.id.UID),
		session:     s.store.Open(p.id, s.cfg.MaxDevices),
		lastMessage: time.Now(),
	}
	conn.session.Listen(conn) // the daemon's warnings
	level.Debug(conn.logger).Log("msg", "allocstats connection opened", "start_time", p.id.StartTime)
	err = conn.serve()
	var ec *errClose
	if errors.As(err, &ec) {
		s.connectionsClosed.WithLabelValues(ec.reason).Inc()
	} else if r := cs.closeReason.Load(); r != nil {
		s.connectionsClosed.WithLabelValues(*r).Inc()
		err = fmt.Errorf("%s: %w", *r, err)
	}
	conn.session.Close(time.Now())
	level.Debug(conn.logger).Log("msg", "allocstats connection closed", "reason", err)
}

// serve reads lines until the connection ends and returns why it ended.
func (cn *connection) serve() error {
	s := cn.s
	lr := newLineReader(newConnReader(cn.cs.c), s.cfg.MaxMessageBytes, s.budget)
	cn.lr = lr
	lr.onEvict = func() { cn.cs.closeFor(closeBufferBudget) }
	defer lr.dropLine()
	// The read deadline is the idle timeout from the last accepted
	// message. Moving it costs a timer update, so it is moved only when it
	// is a second or more behind; when an older one passes, it is moved
	// and the read goes on.
	var armed time.Time
	for {
		if want := cn.lastMessage.Add(s.cfg.IdleTimeout); want.Sub(armed) >= deadlineSlack {
			if err := cn.cs.c.SetReadDeadline(want); err != nil {
				return fmt.Errorf("setting read deadline: %w", err)
			}
			armed = want
		}
		line, err := lr.readLine()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if want := cn.lastMessage.Add(s.cfg.IdleTimeout); time.Now().Before(want) {
				armed = time.Time{}
				continue
			}
		}
		switch {
		case errors.Is(err, errLineTooLong):
			s.messages.WithLabelValues(wire.TypeUnknown, wire.ResultOversize).Inc()
			cn.complain(wire.TypeUnknown, wire.ResultOversize, fmt.Errorf("line over %d bytes, closing the connection", s.cfg.MaxMessageBytes))
			return &errClose{closeOversize, err}
		case errors.Is(err, errBufferBudget):
			s.warnLimit.Warn(cn.logger).Log("msg", "Closing an allocstats connection: the memory budget for unfinished lines is spent and it held the most",
				"limit_bytes", s.cfg.MaxBufferedBytes)
			return &errClose{closeBufferBudget, err}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return &errClose{closeIdle, fmt.Errorf("no message for %s", s.cfg.IdleTimeout)}
		case errors.Is(err, io.EOF):
			return err
		case err != nil:
			return fmt.Errorf("reading: %w", err)
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if len(bytes.TrimSpace(line)) == 0 {
			continue // blank lines are allowed and ignored
		}
		if err := cn.handleLine(line); err != nil {
			return err
		}
	}
}

// handleLine decodes and applies one line. An error closes the connection.
func (cn *connection) handleLine(line []byte) error {
	s := cn.s
	msg, err := wire.DecodeLine(line, s.cfg.MaxDevices)
	if err != nil {
		var de *wire.DecodeError
		if !errors.As(err, &de) {
			de = &wire.DecodeError{Type: wire.TypeUnknown, Result: wire.ResultMalformed, Reason: err.Error()}
		}
		s.messages.WithLabelValues(de.Type, de.Result).Inc()
		cn.complain(de.Type, de.Result, err)
		return nil
	}
	// The connection speaks for its process only while that process runs:
	// a descriptor kept after the process exited (and its pid reused)
	// speaks for nobody. The check is made once per read, after it: a
	// process alive then was alive when every byte of that read was
	// written. The lines the process wrote just before it exited (often
	// the stats and oom of the failure that ended it) may still be queued:
	// once nobody can write on the connection any more (every holder of
	// its other end closed it), what is queued is taken, into the entry
	// the connection already feeds, until EOF.
	if !cn.draining && cn.lr.reads != cn.aliveAt {
		if cn.peer.isAlive() {
			cn.aliveAt = cn.lr.reads
		} else {
			if cn.session.entry == nil || !peerClosed(cn.cs.c) {
				s.messages.WithLabelValues(msg.Type, wire.ResultRejected).Inc()
				return &errClose{closeProcessGone, fmt.Errorf("process %d exited; its connection is closed", cn.peer.id.PID)}
			}
			cn.draining = true
		}
	}
	now := time.Now()
	switch msg.Type {
	case wire.TypeHello:
		err = cn.track(cn.session.Hello(msg.Hello))
		if err == nil && !cn.welcomed && !cn.draining {
			s.messages.WithLabelValues(wire.TypeHello, wire.ResultOK).Inc()
			cn.welcomed = true
			cn.lastMessage = time.Now()
			return cn.sendWelcome()
		}
	case wire.TypeStats:
		if err = cn.canonicalDevices(msg.Devices); err == nil {
			err = cn.track(cn.session.Stats(msg.Devices, now))
		}
	case wire.TypeOOM:
		canonical, total, ok := cn.knownDevice(msg.OOM.UUID)
		if !ok {
			err = fmt.Errorf("unknown device %s", msg.OOM.UUID)
			break
		}
		msg.OOM.UUID = canonical
		msg.OOM.LimitBytes = clampOptional(msg.OOM.LimitBytes, total)
		msg.OOM.FreeBytes = clampOptional(msg.OOM.FreeBytes, total)
		var replyTo Replier
		if !cn.draining {
			replyTo = cn
		}
		_, err = cn.session.OOM(msg.OOM, now, replyTo)
		err = cn.track(err)
	}
	if err != nil {
		cn.reject(msg.Type, err)
		if errors.Is(err, errProcessGone) {
			return &errClose{closeProcessGone, err}
		}
		return nil
	}
	s.acceptedMessages[msg.Type].Inc()
	cn.lastMessage = time.Now()
	return nil
}

// track publishes the entry the session bound to, for closeStale.
func (cn *connection) track(err error) error {
	if e := cn.session.entry; err == nil && e != cn.cs.entry.Load() {
		cn.cs.entry.Store(e)
	}
	return err
}

// canonicalDevices replaces each UUID with NVML's spelling and clamps the
// byte counts to the device's memory; it fails, and the whole message is
// rejected, if NVML does not know one of the devices or two entries name
// the same device.
func (cn *connection) canonicalDevices(devices []DeviceReport) error {
	for i := range devices {
		d := &devices[i]
		canonical, total, ok := cn.knownDevice(d.UUID)
		if !ok {
			return fmt.Errorf("devices[%d]: unknown device %s", i, d.UUID)
		}
		for j := 0; j < i; j++ {
			if devices[j].UUID == canonical {
				return fmt.Errorf("devices[%d]: device %s listed twice", i, canonical)
			}
		}
		d.UUID = canonical
		clampReport(d, total)
	}
	return nil
}

// clampReport caps every byte count of d at the device's total memory (0:
// unknown, no cap): no process holds more than the device has, and a
// client that says so cannot inflate sums.
func clampReport(d *DeviceReport, total uint64) {
	if total == 0 {
		return
	}
	d.Reserved = min(d.Reserved, total)
	for _, o := range []*Optional{&d.Active, &d.Allocated, &d.InactiveSplit, &d.PeakReserved, &d.PeakActive, &d.Limit} {
		*o = clampOptional(*o, total)
	}
}

func clampOptional(o Optional, total uint64) Optional {
	if total > 0 && o.OK && o.V > total {
		o.V = total
	}
	return o
}

func (cn *connection) knownDevice(uuid string) (string, uint64, bool) {
	if cn.s.cfg.KnownDevice == nil {
		return uuid, 0, true
	}
	return cn.s.cfg.KnownDevice(uuid)
}

func (cn *connection) reject(typ string, err error) {
	cn.s.messages.WithLabelValues(typ, wire.ResultRejected).Inc()
	cn.complain(typ, wire.ResultRejected, err)
}

// complain logs a bad line, at warn within the node-wide budget of the
// path and at debug beyond it.
func (cn *connection) complain(typ, result string, err error) {
	cn.s.warnMessage.Warn(cn.logger).Log("msg", "Bad allocstats message", "type", typ, "result", result, "err", err)
}

func (cn *connection) sendWelcome() error {
	w := welcome{
		V:          wire.ProtocolVersion,
		Type:       "welcome",
		IntervalMS: cn.s.cfg.Interval.Milliseconds(),
		Server:     cn.s.cfg.ServerVersion,
		OOMVerdict: cn.s.cfg.OOMVerdict,
	}
	if cn.s.cfg.WarnBefore > 0 {
		secs := cn.s.cfg.WarnBefore.Seconds()
		w.WarnBeforeSeconds = &secs
	}
	b, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("encoding welcome: %w", err)
	}
	b = append(b, '\n')
	if err := cn.write(b); err != nil {
		return fmt.Errorf("writing welcome: %w", err)
	}
	return nil
}

// write sends one line within writeTimeout. The connection's goroutine
// (the welcome) and the OOM reports' (a verdict) both write; the lock
// keeps their lines whole.
func (cn *connection) write(line []byte) error {
	cn.writeMu.Lock()
	defer cn.writeMu.Unlock()
	if err := cn.cs.c.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return fmt.Errorf("setting write deadline: %w", err)
	}
	_, err := cn.cs.c.Write(line)
	return err
}

// Reply implements Replier: it sends a line back to the process (an OOM's
// verdict, a warning). A process that no longer reads, or has exited,
// simply does not get it.
func (cn *connection) Reply(line []byte) {
	if len(line) == 0 || len(line) > cn.s.cfg.MaxMessageBytes || line[len(line)-1] != '\n' {
		return
	}
	if err := cn.write(line); err != nil {
		level.Debug(cn.logger).Log("msg", "message to the client not delivered", "err", err)
	}
}
