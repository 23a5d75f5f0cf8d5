package oom

// The rate limits: what one process or user can make the daemon keep. An
// OOM caught in a loop, or a flood of made-up oom messages, neither
// erases the other users' reports nor grows the ring's memory.

import (
	"sync"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
)

const (
	// PIDReportInterval: at most one report per process in this long.
	PIDReportInterval = 10 * time.Second
	// UIDReportsPerMinute: at most this many reports per uid in a minute
	// (a burst of as many, then one every 60/N seconds).
	UIDReportsPerMinute = 6
)

// Reasons an OOM event gets no report (label reason of
// gpumem_oom_reports_dropped_total).
const (
	dropPIDRate   = "pid_rate"
	dropUIDRate   = "uid_rate"
	dropQueueFull = "queue_full"
)

// limits applies PIDReportInterval and UIDReportsPerMinute.
type limits struct {
	mu      sync.Mutex
	lastPID map[pidKey]time.Time    // last report per process
	uidRate map[uint32]*tokenBucket // report budget per uid
}

type pidKey struct {
	pid   uint32
	start uint64
}

// tokenBucket allows UIDReportsPerMinute at once, then refills one every
// minute/UIDReportsPerMinute.
type tokenBucket struct {
	tokens float64
	last   time.Time
}

func newLimits() *limits {
	return &limits{lastPID: map[pidKey]time.Time{}, uidRate: map[uint32]*tokenBucket{}}
}

// allow applies the per-process and per-uid rates at the event's time, and
// says why not when the event gets no report.
func (l *limits) allow(ev allocstats.OOMEvent) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := ev.Time
	if len(l.lastPID) > 1024 { // forget processes that may report again
		for k, t := range l.lastPID {
			if now.Sub(t) >= PIDReportInterval {
				delete(l.lastPID, k)
			}
		}
	}
	if len(l.uidRate) > 1024 {
		for uid, b := range l.uidRate {
			if now.Sub(b.last) >= time.Minute {
				delete(l.uidRate, uid)
			}
		}
	}
	k := pidKey{ev.PID, ev.StartTime}
	if last, ok := l.lastPID[k]; ok && now.Sub(last) < PIDReportInterval {
		return false, dropPIDRate
	}
	b, ok := l.uidRate[ev.UID]
	if !ok {
		b = &tokenBucket{tokens: UIDReportsPerMinute, last: now}
		l.uidRate[ev.UID] = b
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(UIDReportsPerMinute, b.tokens+d.Minutes()*UIDReportsPerMinute)
		b.last = now
	}
	if b.tokens < 1 {
		return false, dropUIDRate
	}
	b.tokens--
	l.lastPID[k] = now
	return true, ""
}
