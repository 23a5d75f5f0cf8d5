// Package ratelog keeps a warning path from flooding the log: beyond a
// burst, lines go out at debug level instead of warn, and are counted.
package ratelog

import (
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
)

// Limiter is a token bucket shared by every caller of one warning path
// (node-wide, not per connection: a client that reconnects does not get a
// fresh budget). It is safe for concurrent use.
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

// New allows burst lines at once, then one per every.
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
