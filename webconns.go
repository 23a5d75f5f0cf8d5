package main

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// shedListener caps the open connections of a listener. At the cap, a new
// connection closes the connection that has waited longest without a
// request in progress (one that never sent a request, or an idle
// keep-alive one) instead of queueing behind it, so that a flood of idle
// connections cannot keep Prometheus out. Only when every connection is
// serving a request does Accept wait for one to end.
//
// http.Server.ConnState must be set to its connState, which tells it which
// connections are serving.
type shedListener struct {
	net.Listener
	max    int
	closed atomic.Bool
	freed  chan struct{} // poked when a connection goes or turns idle

	mu    sync.Mutex
	conns map[*shedConn]struct{}
	shed  uint64 // connections closed to make room
}

func newShedListener(l net.Listener, max int) *shedListener {
	return &shedListener{Listener: l, max: max, freed: make(chan struct{}, 1), conns: make(map[*shedConn]struct{})}
}

type shedConn struct {
	net.Conn
	l *shedListener
	// Guarded by l.mu.
	busy  bool      // a request is being served
	since time.Time // when it was accepted or last turned idle
}

// Accept implements net.Listener.
func (l *shedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		l.mu.Lock()
		if len(l.conns) < l.max {
			sc := &shedConn{Conn: c, l: l, since: time.Now()}
			l.conns[sc] = struct{}{}
			l.mu.Unlock()
			return sc, nil
		}
		victim := l.longestIdleLocked()
		if victim != nil {
			delete(l.conns, victim)
			l.shed++
		}
		l.mu.Unlock()
		if victim != nil {
			victim.Conn.Close()
			continue
		}
		select { // every connection is serving: wait for one
		case <-l.freed:
		case <-time.After(50 * time.Millisecond):
		}
		if l.closed.Load() {
			c.Close()
			return nil, net.ErrClosed
		}
	}
}

func (l *shedListener) longestIdleLocked() *shedConn {
	var victim *shedConn
	for c := range l.conns {
		if !c.busy && (victim == nil || c.since.Before(victim.since)) {
			victim = c
		}
	}
	return victim
}

// Close implements net.Listener.
func (l *shedListener) Close() error {
	l.closed.Store(true)
	l.poke()
	return l.Listener.Close()
}

func (l *shedListener) poke() {
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// connState is the http.Server.ConnState hook of every shedListener the
// server serves.
func connState(c net.Conn, state http.ConnState) {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
		c = tc.NetConn()
	}
	sc, ok := c.(*shedConn)
	if !ok {
		return
	}
	l := sc.l
	l.mu.Lock()
	sc.busy = state == http.StateActive
	if !sc.busy {
		sc.since = time.Now()
	}
	l.mu.Unlock()
	if !sc.busy {
		l.poke()
	}
}

// Close implements net.Conn.
func (c *shedConn) Close() error {
	c.l.mu.Lock()
	if _, ok := c.l.conns[c]; ok {
		delete(c.l.conns, c)
	}
	c.l.mu.Unlock()
	c.l.poke()
	return c.Conn.Close()
}
