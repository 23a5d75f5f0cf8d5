// Package connshed keeps an HTTP server's connections under a cap without
// letting any one client starve the others: at the cap, a new connection
// closes one that the server is waiting on, never one it is serving.
//
// The rule is who waits for whom. A connection whose client has not sent a
// whole request yet (it sent nothing, half a header, or a header whose body
// never comes), or whose request was refused (basic auth failed) makes the
// server wait; so does an idle keep-alive connection. A connection whose
// request is in a handler, or that the server has not read from yet, makes
// the client wait; it is never closed. So a client cannot keep Prometheus
// out by opening connections as fast as it can or by sending them slowly:
// its connections are the ones closed, while Prometheus's, whose request
// is sent with the connection, is in a handler as soon as it is read.
//
// Per-source limits would not do: on a workstation Prometheus and any
// local user share 127.0.0.1, and in a cluster the source of a scrape is
// whatever the network makes it. Short deadlines alone would not do
// either: a client that opens connections faster than they expire holds
// every slot.
//
// Use NewListener for each listener and Configure on the server that
// serves them.
package connshed

import (
	"context"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// rank orders the connections that may be closed: the lowest rank goes
// first, the longest in its phase first within a rank.
type rank int

const (
	// unproven: no request of this connection has reached a handler: it
	// was just accepted, its header is in progress, or its request was
	// refused before the handler (basic auth) and the server waits for a
	// body or for the client to read the refusal.
	unproven rank = iota
	// served: a request of this connection reached a handler, and none is
	// in one now. Prometheus's keep-alive connection between scrapes.
	served
	// serving: a request is in a handler. Never closed.
	serving
)

// Listener caps the open connections of a net.Listener at max. At the cap,
// Accept closes a connection the server waits on (victimLocked); when there
// is none, it waits for one.
type Listener struct {
	net.Listener
	max    int
	closed atomic.Bool
	freed  chan struct{} // poked when a connection goes or changes state

	mu    sync.Mutex
	conns map[*conn]struct{}
	shed  uint64 // connections closed to make room
}

// NewListener caps l at max open connections.
func NewListener(l net.Listener, max int) *Listener {
	return &Listener{Listener: l, max: max, freed: make(chan struct{}, 1), conns: make(map[*conn]struct{})}
}

type conn struct {
	net.Conn
	l *Listener
	// read: the server has begun reading this connection. Until then
	// its client cannot be judged: a request sent at once waits in the
	// kernel for the connection's goroutine to run.
	read atomic.Bool
	// Guarded by l.mu.
	served   bool      // a request of this connection reached a handler
	handlers int       // requests in a handler now (HTTP/2 serves several)
	since    time.Time // when it was accepted, or last changed state
}

func (c *conn) rankLocked() rank {
	switch {
	case c.handlers > 0:
		return serving
	case c.served:
		return served
	default:
		return unproven
	}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: nc, l: l, since: time.Now()}
	for {
		l.mu.Lock()
		if len(l.conns) < l.max {
			l.conns[c] = struct{}{}
			l.mu.Unlock()
			return c, nil
		}
		victim := l.victimLocked()
		reset := false
		if victim != nil {
			delete(l.conns, victim)
			l.shed++
			reset = victim.rankLocked() == unproven
		}
		l.mu.Unlock()
		if victim != nil {
			if tc, ok := victim.Conn.(*net.TCPConn); ok && reset {
				// A reset costs less than an orderly close, and no
				// response of this connection can be lost.
				tc.SetLinger(0)
			}
			victim.Conn.Close()
			// Let the goroutines of the connections already accepted read
			// what their clients sent before the next one is judged: with
			// GOMAXPROCS=1 a flood would otherwise keep this loop running
			// ahead of them.
			runtime.Gosched()
			continue
		}
		// Every connection is serving, or the server has yet to read the
		// connections of the lowest rank: wait for a change.
		select {
		case <-l.freed:
		case <-time.After(10 * time.Millisecond):
		}
		if l.closed.Load() {
			nc.Close()
			return nil, net.ErrClosed
		}
	}
}

// victimLocked picks the connection to close: of the lowest rank below
// serving, the longest in its phase among those the server has begun to
// read. When the server has read none of that rank yet, it returns nil
// rather than close one of a higher rank: the server catches up within
// moments (each connection's first read pokes Accept).
func (l *Listener) victimLocked() *conn {
	var best [serving]*conn
	var present [serving]bool
	for c := range l.conns {
		r := c.rankLocked()
		if r == serving {
			continue
		}
		present[r] = true
		if c.read.Load() && (best[r] == nil || c.since.Before(best[r].since)) {
			best[r] = c
		}
	}
	for r := range serving {
		if present[r] {
			return best[r]
		}
	}
	return nil
}

// Close implements net.Listener.
func (l *Listener) Close() error {
	l.closed.Store(true)
	l.poke()
	return l.Listener.Close()
}

func (l *Listener) poke() {
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// Read implements net.Conn.
func (c *conn) Read(p []byte) (int, error) {
	if !c.read.Load() {
		c.read.Store(true)
		c.l.poke()
	}
	return c.Conn.Read(p)
}

// Close implements net.Conn.
func (c *conn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	c.l.poke()
	return c.Conn.Close()
}

// Configure makes srv tell its Listeners which connections are serving:
// it sets srv.ConnState and srv.ConnContext, and wraps srv.Handler (set it
// first; exporter-toolkit's basic auth, which wraps the handler when it
// serves, then stays outside, so that a refused request never counts as
// served).
//
// The wrapped handler answers a request that announces a body with 413
// and closes the connection without reading the body: none of the
// exporter's endpoints takes one, and waiting for a body that never comes
// inside a handler would hold the connection as serving.
func Configure(srv *http.Server) {
	srv.ConnState = connState
	srv.ConnContext = connContext
	srv.Handler = handler{srv.Handler}
}

type connKey struct{}

func connContext(ctx context.Context, c net.Conn) context.Context {
	if c := ours(c); c != nil {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

// ours is the Listener's conn under c (unwrapping TLS), or nil.
func ours(c net.Conn) *conn {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	sc, _ := c.(*conn)
	return sc
}

func connState(nc net.Conn, state http.ConnState) {
	c := ours(nc)
	if c == nil {
		return
	}
	if state == http.StateActive || state == http.StateIdle {
		c.l.mu.Lock()
		c.since = time.Now()
		c.l.mu.Unlock()
		c.l.poke()
	}
}

type handler struct{ next http.Handler }

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 { // a length, or -1: chunked
		w.Header().Set("Connection", "close")
		// The server reads what is left of a body after the handler;
		// none will come.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		http.Error(w, "This endpoint takes no request body.", http.StatusRequestEntityTooLarge)
		return
	}
	c, _ := r.Context().Value(connKey{}).(*conn)
	if c == nil {
		h.next.ServeHTTP(w, r)
		return
	}
	c.enter()
	defer c.leave()
	h.next.ServeHTTP(w, r)
}

func (c *conn) enter() {
	c.l.mu.Lock()
	c.handlers++
	c.served = true
	c.l.mu.Unlock()
}

func (c *conn) leave() {
	c.l.mu.Lock()
	c.handlers--
	c.since = time.Now()
	c.l.mu.Unlock()
	c.l.poke()
}
