package allocstats

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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
}

// connection is the state of one client connection, owned by its goroutine.
type connection struct {
	s      *Server
	c      *net.UnixConn
	id     Identity
	logger log.Logger
	// entry is the store entry the connection feeds, nil before its first
	// accepted message.
	entry    *procEntry
	welcomed bool
	// complained: the first bad line is logged at warn, later ones at debug,
	// so that a client sending garbage cannot flood the log.
	complained bool
}

// handle runs one connection until it closes.
func (s *Server) handle(c *net.UnixConn) {
	defer s.untrack(c)
	pid, uid, err := s.peerCred(c)
	if err != nil {
		s.connectionsRejected.WithLabelValues(rejectPeerCred).Inc()
		lvl := level.Debug
		s.peerCredWarn.Do(func() { lvl = level.Warn })
		lvl(s.logger).Log("msg", "Closing allocstats connection without peer credentials", "err", err)
		return
	}
	id := Identity{PID: pid, UID: uid}
	if s.cfg.StartTime != nil {
		st, err := s.cfg.StartTime(pid)
		if err != nil {
			// Pid reuse cannot be detected for this process; not fatal.
			lvl := level.Debug
			s.startTimeWarn.Do(func() { lvl = level.Warn })
			lvl(s.logger).Log("msg", "Cannot read the start time of a connecting process; pid reuse will go unnoticed for it", "pid", pid, "err", err)
		} else {
			id.StartTime = st
		}
	}
	conn := &connection{
		s:      s,
		c:      c,
		id:     id,
		logger: log.With(s.logger, "pid", pid, "uid", uid),
	}
	level.Debug(conn.logger).Log("msg", "allocstats connection opened", "start_time", id.StartTime)
	err = conn.serve()
	s.store.release(conn.entry, s.now())
	level.Debug(conn.logger).Log("msg", "allocstats connection closed", "reason", err)
}

// serve reads lines until the connection ends and returns why it ended.
func (cn *connection) serve() error {
	s := cn.s
	lr := newLineReader(cn.c, s.cfg.MaxMessageBytes)
	for {
		if err := cn.c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout)); err != nil {
			return fmt.Errorf("setting read deadline: %w", err)
		}
		line, err := lr.readLine()
		switch {
		case errors.Is(err, errLineTooLong):
			s.messages.WithLabelValues(TypeUnknown, ResultOversize).Inc()
			cn.complain(TypeUnknown, ResultOversize, fmt.Errorf("line over %d bytes, closing the connection", s.cfg.MaxMessageBytes))
			return err
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("idle for %s", s.cfg.IdleTimeout)
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
	msg, err := DecodeLine(line, s.cfg.MaxDevices)
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) {
			de = &DecodeError{Type: TypeUnknown, Result: ResultMalformed, Reason: err.Error()}
		}
		s.messages.WithLabelValues(de.Type, de.Result).Inc()
		cn.complain(de.Type, de.Result, err)
		return nil
	}
	now := s.now()
	switch msg.Type {
	case TypeHello:
		cn.entry, err = s.store.hello(cn.entry, cn.id, msg.Hello)
		if err != nil {
			cn.reject(TypeHello, err)
			return nil
		}
		s.messages.WithLabelValues(TypeHello, ResultOK).Inc()
		if !cn.welcomed {
			cn.welcomed = true
			return cn.sendWelcome()
		}
	case TypeStats:
		if err := cn.canonicalDevices(msg.Devices); err != nil {
			cn.reject(TypeStats, err)
			return nil
		}
		cn.entry, err = s.store.stats(cn.entry, cn.id, msg.Devices, now, s.cfg.MaxDevices)
		if err != nil {
			cn.reject(TypeStats, err)
			return nil
		}
		s.messages.WithLabelValues(TypeStats, ResultOK).Inc()
	case TypeOOM:
		canonical, ok := cn.knownDevice(msg.OOM.UUID)
		if !ok {
			cn.reject(TypeOOM, fmt.Errorf("unknown device %s", msg.OOM.UUID))
			return nil
		}
		msg.OOM.UUID = canonical
		cn.entry, _, err = s.store.oom(cn.entry, cn.id, msg.OOM, now, s.cfg.MaxDevices)
		if err != nil {
			cn.reject(TypeOOM, err)
			return nil
		}
		s.messages.WithLabelValues(TypeOOM, ResultOK).Inc()
	}
	return nil
}

// canonicalDevices replaces each UUID with NVML's spelling; it fails, and
// the whole message is rejected, if NVML does not know one of them or two
// entries name the same device.
func (cn *connection) canonicalDevices(devices []DeviceReport) error {
	for i := range devices {
		canonical, ok := cn.knownDevice(devices[i].UUID)
		if !ok {
			return fmt.Errorf("devices[%d]: unknown device %s", i, devices[i].UUID)
		}
		for j := 0; j < i; j++ {
			if devices[j].UUID == canonical {
				return fmt.Errorf("devices[%d]: device %s listed twice", i, canonical)
			}
		}
		devices[i].UUID = canonical
	}
	return nil
}

func (cn *connection) knownDevice(uuid string) (string, bool) {
	if cn.s.cfg.KnownDevice == nil {
		return uuid, true
	}
	return cn.s.cfg.KnownDevice(uuid)
}

func (cn *connection) reject(typ string, err error) {
	cn.s.messages.WithLabelValues(typ, ResultRejected).Inc()
	cn.complain(typ, ResultRejected, err)
}

func (cn *connection) complain(typ, result string, err error) {
	lvl := level.Debug
	if !cn.complained {
		cn.complained = true
		lvl = level.Warn
	}
	lvl(cn.logger).Log("msg", "Bad allocstats message (later ones on this connection are logged at debug)", "type", typ, "result", result, "err", err)
}

func (cn *connection) sendWelcome() error {
	b, err := json.Marshal(welcome{
		V:          ProtocolVersion,
		Type:       "welcome",
		IntervalMS: cn.s.cfg.Interval.Milliseconds(),
		Server:     cn.s.cfg.ServerVersion,
	})
	if err != nil {
		return fmt.Errorf("encoding welcome: %w", err)
	}
	b = append(b, '\n')
	if err := cn.c.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return fmt.Errorf("setting write deadline: %w", err)
	}
	if _, err := cn.c.Write(b); err != nil {
		return fmt.Errorf("writing welcome: %w", err)
	}
	return nil
}
