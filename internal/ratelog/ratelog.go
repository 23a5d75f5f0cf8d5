// Package ratelog keeps a warning path from flooding the log: beyond a
// burst, lines go out at debug level instead of warn, and are counted.
//
// Limiters made with Path are node-wide (one budget for the whole path, not
// one per connection: a client that reconnects does not get a fresh one)
// and are counted in gpumem_log_messages_suppressed_total{path}, which the
// Default set exports as a prometheus.Collector.
package ratelog

import (
	"sort"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"
)

// Limiter is a token bucket shared by every caller of one warning path.
// It is safe for concurrent use.
type Limiter struct {
	burst int
	every time.Duration
	now   func() time.Time

	mu         sync.Mutex
	tokens     float64
	last       time.Time
	started    bool
	suppressed uint64
}

// New allows burst lines at once, then one per every. The limiter is not
// counted in any Set: use Path for a warning path of the daemon.
func New(burst int, every time.Duration) *Limiter {
	return &Limiter{burst: burst, every: every, now: time.Now}
}

// Allow reports whether a line may be logged at its own level now, and
// counts it as suppressed when not.
func (l *Limiter) Allow() bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		l.started = true
		l.tokens = float64(l.burst)
		l.last = now
	}
	if d := now.Sub(l.last); d > 0 {
		l.tokens = min(float64(l.burst), l.tokens+float64(d)/float64(l.every))
		l.last = now
	}
	if l.tokens >= 1 {
		l.tokens--
		return true
	}
	l.suppressed++
	return false
}

// Suppressed is how many lines Allow turned down so far.
func (l *Limiter) Suppressed() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.suppressed
}

// Warn returns logger at warn level while the budget lasts, else at debug.
func (l *Limiter) Warn(logger log.Logger) log.Logger {
	if l.Allow() {
		return level.Warn(logger)
	}
	return level.Debug(logger)
}

// Set is a group of named warning paths, counted together. It is a
// prometheus.Collector of gpumem_log_messages_suppressed_total{path}: one
// series per path, from the moment the path is made, at 0 until a line is
// suppressed.
type Set struct {
	mu    sync.Mutex
	paths map[string][]*Limiter
}

// Default is the daemon's set; main registers it.
var Default = &Set{}

// Path returns a new limiter for the warning path name in the Default set.
func Path(name string, burst int, every time.Duration) *Limiter {
	return Default.Path(name, burst, every)
}

// Path returns a new limiter for the warning path name, counted in s under
// that name. Several limiters of one name (one per server in tests) add up.
func (s *Set) Path(name string, burst int, every time.Duration) *Limiter {
	l := New(burst, every)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paths == nil {
		s.paths = make(map[string][]*Limiter)
	}
	s.paths[name] = append(s.paths[name], l)
	return l
}

// Suppressed returns the lines suppressed so far on the path name.
func (s *Set) Suppressed(name string) uint64 {
	s.mu.Lock()
	ls := s.paths[name]
	s.mu.Unlock()
	var n uint64
	for _, l := range ls {
		n += l.Suppressed()
	}
	return n
}

var suppressedDesc = prometheus.NewDesc("gpumem_log_messages_suppressed_total",
	"Log lines of a rate-limited warning path that went out at debug level instead of warn, by path.",
	[]string{"path"}, nil)

// Describe implements prometheus.Collector.
func (s *Set) Describe(ch chan<- *prometheus.Desc) { ch <- suppressedDesc }

// Collect implements prometheus.Collector.
func (s *Set) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	names := make([]string, 0, len(s.paths))
	for name := range s.paths {
		names = append(names, name)
	}
	s.mu.Unlock()
	sort.Strings(names)
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(suppressedDesc, prometheus.CounterValue, float64(s.Suppressed(name)), name)
	}
}
