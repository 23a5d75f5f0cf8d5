package allocstats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"
)

// writeTimeout bounds the welcome write, so that a client that never reads
// cannot hold its connection's goroutine.
const writeTimeout = 2 * time.Second

// Config configures a Server. Zero values take the defaults (Default…).
type Config struct {
	SocketPath string
	// SocketExplicit says the user chose SocketPath: Listen then fails if it
	// cannot be used, instead of falling back (see ResolveSocketPath).
	SocketExplicit  bool
	SocketMode      os.FileMode   // of the socket file; identity comes from the kernel, not the mode
	MaxMessageBytes int           // per line, newline excluded
	MaxConnections  int           // open at once; more are accepted and closed at once
	MaxDevices      int           // per stats message, and per process
	IdleTimeout     time.Duration // a connection silent this long is closed
	Interval        time.Duration // push interval advertised in welcome
	ServerVersion   string        // advertised in welcome
	// KnownDevice maps a normalised UUID to NVML's spelling, false when NVML
	// does not know the device. Nil accepts every well-formed UUID as is.
	KnownDevice func(uuid string) (canonical string, ok bool)
	// StartTime returns a process's start time (/proc/<pid>/stat field 22),
	// read when a connection opens so that a reused pid never inherits
	// another process's series. Nil, or an error, leaves it unknown (0).
	StartTime func(pid uint32) (uint64, error)
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
	if c.MaxDevices == 0 {
		c.MaxDevices = DefaultMaxDevices
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.ServerVersion == "" {
		c.ServerVersion = "unknown"
	}
	switch {
	case c.MaxMessageBytes < 64:
		return fmt.Errorf("max message bytes %d: must be at least 64", c.MaxMessageBytes)
	case c.MaxConnections < 0:
		return fmt.Errorf("max connections %d: must be positive", c.MaxConnections)
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

	connections         prometheus.Gauge
	messages            *prometheus.CounterVec
	connectionsRejected *prometheus.CounterVec

	// Replaced in tests.
	now      func() time.Time
	peerCred func(*net.UnixConn) (pid, uid uint32, err error)

	startTimeWarn sync.Once
	peerCredWarn  sync.Once

	mu       sync.Mutex
	listener *net.UnixListener
	conns    map[*net.UnixConn]struct{}
	serving  bool
	closing  bool
	wg       sync.WaitGroup
}

// Connection rejection reasons (label reason of
// gpumem_allocstats_connections_rejected_total).
const (
	rejectMaxConnections = "max_connections"
	rejectPeerCred       = "peer_credentials"
)

// messageLabels are the type/result pairs that can occur; they are
// pre-initialised at 0.
var messageLabels = [][2]string{
	{TypeHello, ResultOK}, {TypeHello, ResultRejected},
	{TypeStats, ResultOK}, {TypeStats, ResultRejected},
	{TypeOOM, ResultOK}, {TypeOOM, ResultRejected},
	{TypeUnknown, ResultRejected}, {TypeUnknown, ResultMalformed}, {TypeUnknown, ResultOversize},
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
			Help: "Connections closed at once: over the connection limit, or without peer credentials.",
		}, []string{"reason"}),
		now:      time.Now,
		peerCred: peerCredentials,
		conns:    make(map[*net.UnixConn]struct{}),
	}
	for _, l := range messageLabels {
		s.messages.WithLabelValues(l[0], l[1])
	}
	s.connectionsRejected.WithLabelValues(rejectMaxConnections)
	s.connectionsRejected.WithLabelValues(rejectPeerCred)
	return s, nil
}

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	s.connections.Describe(ch)
	s.messages.Describe(ch)
	s.connectionsRejected.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	s.connections.Collect(ch)
	s.messages.Collect(ch)
	s.connectionsRejected.Collect(ch)
}

// Close closes the listener (removing the socket file) and every
// connection. Serve does it when its context ends; Close is for a server
// that will not serve.
func (s *Server) Close() { s.shutdown() }

// SocketPath returns where the server listens: after Listen, the path
// ResolveSocketPath chose.
func (s *Server) SocketPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.SocketPath
}

// Listen creates the socket: the path resolved with ResolveSocketPath
// (SocketExplicit, SocketPath), the directory (0755) created if missing, a
// stale socket file of a dead daemon removed, the file mode set. It fails
// when another daemon answers on the path or the path cannot be used.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener != nil {
		return fmt.Errorf("already listening on %s", s.cfg.SocketPath)
	}
	path, err := ResolveSocketPath(s.cfg.SocketExplicit, s.cfg.SocketPath)
	if err != nil {
		return err
	}
	if path != s.cfg.SocketPath {
		level.Warn(s.logger).Log("msg", "The default socket directory cannot be used; using a fallback (set GPUMEM_SOCKET in clients to it)",
			"default", s.cfg.SocketPath, "socket", path)
		s.cfg.SocketPath = path
	}
	l, err := listenUnix(path, s.cfg.SocketMode)
	if err != nil {
		return err
	}
	s.listener = l
	level.Info(s.logger).Log("msg", "Listening for allocator stats", "socket", path, "mode", fmt.Sprintf("%#o", s.cfg.SocketMode))
	return nil
}

// Serve accepts connections until ctx is done, then closes the listener
// (which removes the socket file) and every connection, and waits for their
// goroutines. It returns nil after a shutdown through ctx.
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

	var backoff time.Duration
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				s.shutdown()
				s.wg.Wait()
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				s.shutdown()
				s.wg.Wait()
				return fmt.Errorf("allocstats listener closed: %w", err)
			}
			// Out of file descriptors and the like: back off, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			level.Warn(s.logger).Log("msg", "Accepting allocstats connection failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			continue
		}
		backoff = 0
		switch err := s.track(c); {
		case errors.Is(err, errConnectionLimit):
			s.connectionsRejected.WithLabelValues(rejectMaxConnections).Inc()
			level.Debug(s.logger).Log("msg", "Connection limit reached, closing new allocstats connection", "limit", s.cfg.MaxConnections)
			c.Close()
		case err != nil:
			c.Close()
		default:
			go s.handle(c)
		}
	}
}

var (
	errConnectionLimit = errors.New("connection limit reached")
	errShuttingDown    = errors.New("shutting down")
)

// track registers an accepted connection.
func (s *Server) track(c *net.UnixConn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return errShuttingDown
	}
	if len(s.conns) >= s.cfg.MaxConnections {
		return errConnectionLimit
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.connections.Inc()
	return nil
}

func (s *Server) untrack(c *net.UnixConn) {
	s.mu.Lock()
	if _, ok := s.conns[c]; ok {
		delete(s.conns, c)
		s.connections.Dec()
	}
	s.mu.Unlock()
	c.Close()
	s.wg.Done()
}

// shutdown closes the listener and every connection; idempotent.
func (s *Server) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	if s.listener != nil {
		s.listener.Close()
	}
	for c := range s.conns {
		c.Close()
	}
}
