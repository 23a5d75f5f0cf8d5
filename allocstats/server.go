package allocstats

import (
	"context"
	"errors"
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/internal/defaults"
	"github.com/gpumem/gpumem_exporter/internal/ratelog"
	"github.com/gpumem/gpumem_exporter/internal/tick"
)

// writeTimeout bounds the welcome write, so that a client that never reads
// cannot hold its connection's goroutine.
const writeTimeout = 2 * time.Second

// checkInterval is how often the server closes the connections of exited
// processes and of removed entries, and checks that its socket file is
// still there.
const checkInterval = time.Second

// Config configures a Server. Zero values take the defaults (Default…).
type Config struct {
	SocketPath string
	// SocketExplicit says the user chose SocketPath: Listen then fails if it
	// cannot be used (its directory must exist), instead of falling back
	// (see resolveSocketPath).
	SocketExplicit  bool
	SocketMode      os.FileMode // of the socket file; identity comes from the kernel, not the mode
	MaxMessageBytes int         // per line, newline excluded
	MaxConnections  int         // open at once; more are accepted and closed at once
	// MaxConnectionsPerUID bounds the open connections of one uid.
	MaxConnectionsPerUID int
	// MaxBufferedBytes bounds the memory of unfinished lines over all
	// connections; at least MaxMessageBytes.
	MaxBufferedBytes int
	MaxDevices       int           // per stats message, and per process
	IdleTimeout      time.Duration // a connection without an accepted message this long is closed
	Interval         time.Duration // push interval advertised in welcome
	ServerVersion    string        // advertised in welcome
	// OOMVerdict is advertised in welcome: something answers OOM events
	// through OOMEvent.ReplyTo.
	OOMVerdict bool
	// WarnBefore is advertised in welcome: something sends a warning
	// message (Store.Send) when it foresees a process running out of
	// memory within this long. 0: nothing does.
	WarnBefore time.Duration
	// KnownDevice maps a normalised UUID to NVML's spelling and the
	// device's total memory (0 when unknown), ok false when NVML does not
	// know the device. Byte counts a client sends are clamped to the
	// total. Nil accepts every well-formed UUID as is, unclamped.
	KnownDevice func(uuid string) (canonical string, totalBytes uint64, ok bool)
	// ProcPath is procfs, where a peer's start time and uid are read
	// (the host's /proc: the daemon runs in the host PID namespace).
	ProcPath string
}

func (c *Config) setDefaults() error {
	if c.SocketPath == "" {
		c.SocketPath = DefaultSocketPath
	}
	if c.SocketMode == 0 {
		c.SocketMode = DefaultSocketMode
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxConnectionsPerUID == 0 {
		c.MaxConnectionsPerUID = DefaultMaxConnectionsPerUID
	}
	if c.MaxBufferedBytes == 0 {
		c.MaxBufferedBytes = max(DefaultMaxBufferedBytes, c.MaxMessageBytes)
	}
	if c.MaxDevices == 0 {
		c.MaxDevices = DefaultMaxDevices
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.Interval == 0 {
		c.Interval = defaultInterval
	}
	if c.ServerVersion == "" {
		c.ServerVersion = "unknown"
	}
	if c.ProcPath == "" {
		c.ProcPath = defaults.ProcPath
	}
	switch {
	case c.MaxMessageBytes < 64:
		return fmt.Errorf("max message bytes %d: must be at least 64", c.MaxMessageBytes)
	case c.MaxConnections < 0:
		return fmt.Errorf("max connections %d: must be positive", c.MaxConnections)
	case c.MaxConnectionsPerUID < 0:
		return fmt.Errorf("max connections per uid %d: must be positive", c.MaxConnectionsPerUID)
	case c.MaxBufferedBytes < c.MaxMessageBytes:
		return fmt.Errorf("max buffered bytes %d: must be at least the max message bytes, %d", c.MaxBufferedBytes, c.MaxMessageBytes)
	case c.MaxDevices < 0:
		return fmt.Errorf("max devices %d: must be positive", c.MaxDevices)
	case c.IdleTimeout < 0:
		return fmt.Errorf("idle timeout %s: must be positive", c.IdleTimeout)
	case c.Interval < time.Millisecond:
		return fmt.Errorf("interval %s: must be at least 1ms", c.Interval)
	case c.SocketMode&^os.ModePerm != 0:
		return fmt.Errorf("socket mode %v: only permission bits are allowed", c.SocketMode)
	}
	return nil
}

// Server accepts connections on the allocstats socket and feeds the Store.
type Server struct {
	cfg    Config
	store  *Store
	logger log.Logger
	budget *bufferBudget

	connections         prometheus.Gauge
	messages            *prometheus.CounterVec
	connectionsRejected *prometheus.CounterVec
	connectionsClosed   *prometheus.CounterVec
	// acceptedMessages are messages' ok counters by type, looked up once
	// (the label lookup per line was a few per cent of ingest CPU).
	acceptedMessages map[string]prometheus.Counter

	// Node-wide limits on the warning paths: no client, however many
	// connections it opens, floods the log.
	warnMessage, warnRefused, warnLimit, warnAccept, warnSocket *ratelog.Limiter

	// identify says who is at the other end of a connection: identifyPeer,
	// from the kernel's peer credentials and ProcPath, and nothing else in
	// the daemon. It stays a field for the tests alone, as connectingUID
	// does: a test process is one peer to the kernel, and the tests of the
	// per-uid caps, of a thousand concurrent clients and of a peer without
	// credentials need many peers, or one the kernel never gives.
	identify func(c kernelConn, acceptedAt time.Duration) (*peer, error)
	// connectingUID is the uid the kernel recorded for a connection's
	// peer (kernelUID), read at accept for the global cap's share.
	connectingUID func(c kernelConn) (uint32, bool)

	mu       sync.Mutex
	listener *net.UnixListener
	sock     socketFile // what Listen created, to unlink only that
	socketOK bool       // the socket file is ours and in place
	conns    map[*connState]struct{}
	perUID   map[uint32]int // open identified connections per uid
	byUID    map[uint32]int // connections in conns per uid at accept (connState.uid)
	accepted uint64         // connections accepted so far: connState.seq
	serving  bool
	closing  bool
	wg       sync.WaitGroup
}

// connState is one open connection as the server tracks it.
type connState struct {
	c *net.UnixConn
	// uid is the peer's uid as the kernel recorded it at accept, where
	// hasUID; seq orders the connections by accept.
	uid    uint32
	hasUID bool
	seq    uint64
	// Set under Server.mu once the peer is identified and admitted.
	peer *peer
	// entry is the store entry the connection feeds (nil before its first
	// accepted message); the periodic check closes the connection when the
	// entry is removed.
	entry atomic.Pointer[procEntry]
	// closeReason, when set, says why the server closed the connection.
	closeReason atomic.Pointer[string]
}

// closeFor closes the connection from outside its goroutine, noting why.
func (cs *connState) closeFor(reason string) {
	cs.closeReason.CompareAndSwap(nil, &reason)
	cs.c.Close()
}

// Connection rejection reasons (label reason of
// gpumem_allocstats_connections_rejected_total).
const (
	rejectMaxConnections       = "max_connections"
	rejectMaxConnectionsPerUID = "max_connections_per_uid"
	rejectPeerCred             = "peer_credentials"
	rejectPeerGone             = "peer_gone"
)

// Reasons the server closes a connection it had admitted (label reason of
// gpumem_allocstats_connections_closed_total).
const (
	closeIdle         = "idle"
	closeOversize     = "oversize"
	closeBufferBudget = "buffer_budget"
	closeProcessGone  = "process_gone"
	// closeMaxConnections: at the global cap, the newest connection of
	// the uid holding the most made room for a uid that held none.
	closeMaxConnections = "max_connections"
)

// messageLabels are the type/result pairs that can occur; they are
// pre-initialised at 0.
var messageLabels = [][2]string{
	{wire.TypeHello, wire.ResultOK}, {wire.TypeHello, wire.ResultRejected},
	{wire.TypeStats, wire.ResultOK}, {wire.TypeStats, wire.ResultRejected},
	{wire.TypeOOM, wire.ResultOK}, {wire.TypeOOM, wire.ResultRejected},
	{wire.TypeUnknown, wire.ResultRejected}, {wire.TypeUnknown, wire.ResultMalformed}, {wire.TypeUnknown, wire.ResultOversize},
}

// NewServer checks cfg and fills its defaults. It does not open the
// socket: Listen does. The server is a prometheus.Collector of its own
// metrics (gpumem_allocstats_*).
func NewServer(cfg Config, store *Store, logger log.Logger) (*Server, error) {
	if store == nil {
		return nil, errors.New("allocstats: nil store")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("allocstats config: %w", err)
	}
	if logger == nil {
		logger = log.NewNopLogger()
	}
	s := &Server{
		cfg:    cfg,
		store:  store,
		logger: logger,
		budget: newBufferBudget(cfg.MaxBufferedBytes),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prometheus.BuildFQName("gpumem", "allocstats", "connections"),
			Help: "Open connections on the allocator stats socket.",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prometheus.BuildFQName("gpumem", "allocstats", "messages_total"),
			Help: "Lines received on the allocator stats socket, by message type and result (ok, malformed, rejected, oversize).",
		}, []string{"type", "result"}),
		connectionsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prometheus.BuildFQName("gpumem", "allocstats", "connections_rejected_total"),
			Help: "Connections closed at once: over a connection limit, without peer credentials, or whose process was gone before it could be identified.",
		}, []string{"reason"}),
		connectionsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prometheus.BuildFQName("gpumem", "allocstats", "connections_closed_total"),
			Help: "Admitted connections the daemon closed: idle, an oversize line, the buffer budget spent, the process gone (exited, or its entry removed), or room made at the connection limit for a uid that held none.",
		}, []string{"reason"}),
		warnMessage: ratelog.Path("allocstats_bad_message", 10, 6*time.Second),
		warnRefused: ratelog.Path("allocstats_connection_refused", 10, 6*time.Second),
		warnLimit:   ratelog.Path("allocstats_limit", 10, 6*time.Second),
		warnAccept:  ratelog.Path("allocstats_accept", 5, 10*time.Second),
		warnSocket:  ratelog.Path("allocstats_socket", 5, 10*time.Second),
		conns:       make(map[*connState]struct{}),
		perUID:      make(map[uint32]int),
		byUID:       make(map[uint32]int),
	}
	s.identify = s.identifyPeer
	s.connectingUID = kernelUID
	for _, l := range messageLabels {
		s.messages.WithLabelValues(l[0], l[1])
	}
	s.acceptedMessages = map[string]prometheus.Counter{}
	for _, typ := range []string{wire.TypeHello, wire.TypeStats, wire.TypeOOM} {
		s.acceptedMessages[typ] = s.messages.WithLabelValues(typ, wire.ResultOK)
	}
	for _, r := range []string{rejectMaxConnections, rejectMaxConnectionsPerUID, rejectPeerCred, rejectPeerGone} {
		s.connectionsRejected.WithLabelValues(r)
	}
	for _, r := range []string{closeIdle, closeOversize, closeBufferBudget, closeProcessGone, closeMaxConnections} {
		s.connectionsClosed.WithLabelValues(r)
	}
	return s, nil
}

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	s.connections.Describe(ch)
	s.messages.Describe(ch)
	s.connectionsRejected.Describe(ch)
	s.connectionsClosed.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	s.connections.Collect(ch)
	s.messages.Collect(ch)
	s.connectionsRejected.Collect(ch)
	s.connectionsClosed.Collect(ch)
}

// Close closes the listener (removing the socket file) and every
// connection; Serve then returns nil. Serve does it when its context ends.
func (s *Server) Close() { s.shutdown() }

// SocketPath returns where the server listens: after Listen, the path
// resolveSocketPath chose.
func (s *Server) SocketPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.SocketPath
}

// SocketReady reports whether the socket file the server created is in
// place (false before Listen, and while a vanished socket could not be
// recreated), for /-/ready.
func (s *Server) SocketReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.socketOK && !s.closing
}

// Listen creates the socket: the path resolved with resolveSocketPath
// (SocketExplicit, SocketPath), a stale socket file of a dead daemon
// removed, the file mode set. It fails when another daemon answers on the
// path or the path cannot be used.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener != nil {
		return fmt.Errorf("already listening on %s", s.cfg.SocketPath)
	}
	path, err := resolveSocketPath(s.cfg.SocketExplicit, s.cfg.SocketPath, os.Getenv("XDG_RUNTIME_DIR"), os.TempDir(), os.Getuid())
	if err != nil {
		return err
	}
	if path != s.cfg.SocketPath {
		level.Warn(s.logger).Log("msg", "The default socket directory cannot be used; using a fallback (set GPUMEM_SOCKET in clients to it)",
			"default", s.cfg.SocketPath, "socket", path)
		s.cfg.SocketPath = path
	}
	l, sock, err := listenUnix(path, s.cfg.SocketMode)
	if err != nil {
		return err
	}
	s.listener, s.sock, s.socketOK = l, sock, true
	level.Info(s.logger).Log("msg", "Listening for allocator stats", "socket", path, "mode", fmt.Sprintf("%#o", s.cfg.SocketMode))
	return nil
}

// acceptResult is what an accept loop ends with.
type acceptResult struct {
	l   *net.UnixListener
	err error
}

// Serve accepts connections until ctx is done, then closes the listener
// (which removes the socket file) and every connection, and waits for their
// goroutines. It returns nil after a shutdown through ctx. Every second it
// closes the connections of exited processes and of removed entries, and
// recreates the socket file if it vanished.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	l := s.listener
	if l == nil {
		s.mu.Unlock()
		return errors.New("allocstats: Serve called before Listen")
	}
	if s.serving {
		s.mu.Unlock()
		return errors.New("allocstats: Serve called twice")
	}
	s.serving = true
	s.mu.Unlock()

	stop := context.AfterFunc(ctx, func() { s.shutdown() })
	defer stop()

	ended := make(chan acceptResult, 4)
	go s.acceptLoop(ctx, l, ended)
	// The check runs on the grid of its period (tick.Next), as the NVML
	// poll does: an idle daemon wakes once for both.
	check := time.NewTimer(tick.Next(time.Now(), checkInterval))
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			s.shutdown()
			s.wg.Wait()
			return nil
		case r := <-ended:
			s.mu.Lock()
			current, closing := r.l == s.listener, s.closing
			s.mu.Unlock()
			if !current {
				continue // replaced by a recreated socket
			}
			s.shutdown()
			s.wg.Wait()
			if ctx.Err() != nil || closing {
				return nil // shut down through ctx or Close
			}
			return fmt.Errorf("allocstats listener closed: %w", r.err)
		case <-check.C:
			s.closeStale()
			if nl := s.checkSocket(); nl != nil {
				go s.acceptLoop(ctx, nl, ended)
			}
			check.Reset(tick.Next(time.Now(), checkInterval))
		}
	}
}

// acceptLoop accepts on l until it is closed.
func (s *Server) acceptLoop(ctx context.Context, l *net.UnixListener, ended chan<- acceptResult) {
	var backoff time.Duration
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				ended <- acceptResult{l, err}
				return
			}
			// Out of file descriptors and the like: back off, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.warnAccept.Warn(s.logger).Log("msg", "Accepting allocstats connection failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			continue
		}
		backoff = 0
		acceptedAt := bootTime()
		cs := &connState{c: c}
		cs.uid, cs.hasUID = s.connectingUID(c)
		switch err := s.track(cs); {
		case errors.Is(err, errConnectionLimit):
			s.connectionsRejected.WithLabelValues(rejectMaxConnections).Inc()
			s.warnLimit.Warn(s.logger).Log("msg", "Connection limit reached, closing new allocstats connection", "limit", s.cfg.MaxConnections)
			c.Close()
		case err != nil:
			c.Close()
		default:
			go s.handle(cs, acceptedAt)
		}
	}
}

var (
	errConnectionLimit       = errors.New("connection limit reached")
	errConnectionLimitForUID = errors.New("connection limit of the uid reached")
	errShuttingDown          = errors.New("shutting down")
)

// track registers an accepted connection. At the global cap, a
// connection of a uid that holds none takes the place of the newest
// connection of the uid that holds the most, if that uid holds more than
// one: however many uids one party spreads its connections over (root can
// take any), a user who is not connected yet gets in. Any other
// connection over the cap is refused.
func (s *Server) track(cs *connState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return errShuttingDown
	}
	if len(s.conns) >= s.cfg.MaxConnections {
		if !cs.hasUID || s.byUID[cs.uid] > 0 || !s.makeRoomLocked() {
			return errConnectionLimit
		}
	}
	s.accepted++
	cs.seq = s.accepted
	s.conns[cs] = struct{}{}
	if cs.hasUID {
		s.byUID[cs.uid]++
	}
	s.wg.Add(1)
	s.connections.Inc()
	return nil
}

// makeRoomLocked closes the newest connection of the uid that holds the
// most connections, if it holds more than one, and reports whether it did.
func (s *Server) makeRoomLocked() bool {
	var top uint32
	most := 1
	for uid, n := range s.byUID {
		if n > most {
			top, most = uid, n
		}
	}
	if most <= 1 {
		return false
	}
	var newest *connState
	for cs := range s.conns {
		if cs.hasUID && cs.uid == top && (newest == nil || cs.seq > newest.seq) {
			newest = cs
		}
	}
	if newest == nil {
		return false
	}
	s.forgetLocked(newest)
	newest.closeFor(closeMaxConnections)
	s.warnLimit.Warn(s.logger).Log("msg", "Connection limit reached; closing the newest connection of the uid that holds the most, for a uid that holds none",
		"limit", s.cfg.MaxConnections, "closed_uid", top, "its_connections", most)
	return true
}

// forgetLocked takes cs out of the connections the caps count.
func (s *Server) forgetLocked(cs *connState) {
	delete(s.conns, cs)
	if cs.hasUID {
		if s.byUID[cs.uid]--; s.byUID[cs.uid] <= 0 {
			delete(s.byUID, cs.uid)
		}
	}
	s.connections.Dec()
}

// admit binds an identified peer to its connection, within the uid's
// connection limit.
func (s *Server) admit(cs *connState, p *peer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perUID[p.id.UID] >= s.cfg.MaxConnectionsPerUID {
		return errConnectionLimitForUID
	}
	s.perUID[p.id.UID]++
	cs.peer = p
	return nil
}

func (s *Server) untrack(cs *connState) {
	s.mu.Lock()
	if _, ok := s.conns[cs]; ok {
		s.forgetLocked(cs)
	}
	if p := cs.peer; p != nil {
		if s.perUID[p.id.UID]--; s.perUID[p.id.UID] <= 0 {
			delete(s.perUID, p.id.UID)
		}
		// Under the lock: closeStale never asks a closed pidfd.
		p.close()
	}
	s.mu.Unlock()
	cs.c.Close()
	s.wg.Done()
}

// closeStale closes the connections whose process exited (where that is
// cheap to ask: a pidfd, or Prune found it gone) or whose store entry was
// removed, so that their clients reconnect and their slots are free. A
// connection of an exited process whose other end is closed by every
// holder is left to read what its process queued: its EOF is at most a
// socket buffer away.
func (s *Server) closeStale() {
	// While the poller prunes the store (every poll), a process that exits
	// has its entry marked at the next poll, so a connection bound to an
	// entry needs no check of its own: one poll(2) of all the processes'
	// pidfds replaces a signal to each connection's pidfd every second. A
	// connection not bound yet, or a store nobody prunes as often as this
	// check runs, is asked through its pidfd.
	pruned := s.store.prunedSince(time.Now().Add(-2 * checkInterval))
	s.mu.Lock()
	defer s.mu.Unlock()
	for cs := range s.conns {
		e := cs.entry.Load()
		if e != nil && e.removed.Load() {
			cs.closeFor(closeProcessGone)
			continue
		}
		gone := e != nil && e.exited.Load()
		if p := cs.peer; !gone && p != nil && p.sweep && (e == nil || !pruned) {
			gone = !p.isAlive()
		}
		if gone && (e == nil || !peerClosed(cs.c)) {
			cs.closeFor(closeProcessGone)
		}
	}
}

// shutdown closes the listener and every connection; idempotent.
func (s *Server) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing && s.listener != nil {
		s.listener.SetUnlinkOnClose(false)
		s.listener.Close()
		s.sock.remove()
	}
	s.closing = true
	for cs := range s.conns {
		cs.c.Close()
	}
}

// checkSocket checks that the socket file is still the one the server
// created. When it vanished (or another file took its place and nobody
// answers there), it creates a new socket and returns its listener, which
// the caller serves; the old listener is closed. While no socket can be
// made, SocketReady is false.
func (s *Server) checkSocket() *net.UnixListener {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.listener == nil {
		return nil
	}
	if s.sock.inPlace() {
		if !s.socketOK {
			level.Info(s.logger).Log("msg", "The allocstats socket is back", "socket", s.sock.path)
		}
		s.socketOK = true
		return nil
	}
	s.socketOK = false
	l, sock, err := listenUnix(s.sock.path, s.cfg.SocketMode)
	if err != nil {
		s.warnSocket.Warn(s.logger).Log("msg", "The allocstats socket file vanished or was replaced, and cannot be recreated; clients cannot connect (/-/ready fails)", "socket", s.sock.path, "err", err)
		return nil
	}
	s.warnSocket.Warn(s.logger).Log("msg", "The allocstats socket file vanished or was replaced; recreated it", "socket", s.sock.path)
	old := s.listener
	old.SetUnlinkOnClose(false)
	s.listener, s.sock, s.socketOK = l, sock, true
	old.Close()
	return l
}
