// Package foresight foresees out-of-memory errors before they happen. From
// every poll's join it keeps each process's active memory over the last
// minutes (on the clock of the samples themselves: the simulated node's
// when simulated), measures a steady climb of its floor (a leak) or of its
// steps' peak (a growing batch), and estimates when the climb would reach
// the process's ceiling: its limit, or what it holds plus the GPU's free
// memory. The estimate is each row's TimeToOOM in the join
// (gpumem_allocator_time_to_oom_seconds), the trend behind the OOM
// reports' verdicts, and, under a threshold, a warning message sent to the
// process itself over its socket connection.
package foresight

import (
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/internal/ratelog"
)

// DefaultWarnBefore is the estimate under which a process is warned when
// neither the daemon's flag nor the client's hello says otherwise.
const DefaultWarnBefore = 10 * time.Minute

// forgetAfter is how long a process's trend is kept after the join last
// showed it running: the OOM report of a process that dies at once still
// reads it.
const forgetAfter = 2 * time.Minute

// Clients are the processes' connections: what a process asked for in its
// hello, and a way to send it a line. allocstats.Store implements it.
type Clients interface {
	Process(pid uint32) (allocstats.Process, bool)
	Send(pid uint32, start uint64, line []byte) int
}

// Config configures a Forecaster.
type Config struct {
	// WarnBefore is the estimate under which a process is warned, unless
	// its hello asked for another (DefaultWarnBefore when 0; negative:
	// no warnings).
	WarnBefore time.Duration
	// Clients receive the warnings; nil: none are sent.
	Clients Clients
	Logger  log.Logger
}

// Forecaster keeps every running process's trend and forecast. It is an
// attribution.ViewObserver (fed after each poll), an attribution.Forecasts
// (read by every join), the trend source of the OOM reports, and a
// prometheus.Collector of gpumem_oom_warnings_total.
type Forecaster struct {
	cfg     Config
	logger  log.Logger
	logs    *ratelog.Limiter
	tracker *Tracker
	sent    *prometheus.CounterVec

	mu        sync.Mutex
	forecasts map[diagnosis.Key]diagnosis.Forecast // while a climb is measured
	last      map[diagnosis.Key]diagnosis.Forecast // the last one measured, kept for the verdict
	schedule  *Schedule
	ooms      map[diagnosis.Key]uint64    // the OOM counter each process had at the last poll
	seen      map[diagnosis.Key]time.Time // when a join last showed it running (wall clock)
	// deliver sends a batch of warnings; a goroutine of its own by default,
	// so that a slow client never holds up the poll.
	deliver func([]outgoing)
}

// warned is the last warning sent to a process: when (on the samples'
// clock) and what it foresaw.
type warned struct {
	at  time.Time
	eta time.Duration
}

// outgoing is one warning to send.
type outgoing struct {
	pid   uint32
	start uint64
	line  []byte
	cause diagnosis.Cause
}

// New returns a Forecaster that has seen nothing yet.
func New(cfg Config) *Forecaster {
	if cfg.WarnBefore == 0 {
		cfg.WarnBefore = DefaultWarnBefore
	}
	if cfg.Logger == nil {
		cfg.Logger = log.NewNopLogger()
	}
	f := &Forecaster{
		cfg:       cfg,
		logger:    cfg.Logger,
		logs:      ratelog.Path("oom_warning", 10, 6*time.Second),
		tracker:   NewTracker(),
		forecasts: map[diagnosis.Key]diagnosis.Forecast{},
		last:      map[diagnosis.Key]diagnosis.Forecast{},
		schedule:  NewSchedule(),
		ooms:      map[diagnosis.Key]uint64{},
		seen:      map[diagnosis.Key]time.Time{},
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_oom_warnings_total",
			Help: "Warnings sent to processes foreseen to run out of GPU memory, by the cause foreseen (leak, growth) and whether an open connection of the process took the message (delivered=\"true\").",
		}, []string{"cause", "delivered"}),
	}
	f.deliver = func(batch []outgoing) { go f.send(batch) }
	for _, c := range []diagnosis.Cause{diagnosis.Leak, diagnosis.Growth} {
		for _, d := range []string{"true", "false"} {
			f.sent.WithLabelValues(string(c), d)
		}
	}
	return f
}

// Describe implements prometheus.Collector.
func (f *Forecaster) Describe(ch chan<- *prometheus.Desc) { f.sent.Describe(ch) }

// Collect implements prometheus.Collector.
func (f *Forecaster) Collect(ch chan<- prometheus.Metric) { f.sent.Collect(ch) }

// ObserveSample implements allocstats.SampleObserver: the history of
// active memory is made of every sample a client pushed, at its own time.
func (f *Forecaster) ObserveSample(pid uint32, start uint64, uuid string, at time.Time, active uint64) {
	k := diagnosis.Key{PID: pid, Start: start, UUID: uuid}
	f.tracker.Note(k, at, active)
	f.mu.Lock()
	f.seen[k] = time.Now()
	f.mu.Unlock()
}

// ObserveView measures each running process's climb at its newest sample,
// forecasts it and warns the processes whose estimate fell under their
// threshold.
func (f *Forecaster) ObserveView(v attribution.View) {
	free := map[string]uint64{}
	if v.Snapshot != nil {
		for _, d := range v.Snapshot.Devices {
			if d.ExportsMemory() && d.HasMemory {
				free[d.UUID] = d.Memory.Free
			}
		}
	}
	now := time.Now()
	var batch []outgoing
	f.mu.Lock()
	for i := range v.Rows {
		r := &v.Rows[i]
		if r.Alloc == nil || r.Exited || !r.Alloc.Active.OK {
			continue
		}
		k := r.DiagnosisKey()
		f.seen[k] = now
		at := r.Alloc.SampledAt
		if at.IsZero() {
			at = r.Alloc.LastReport
		}
		if n := r.Alloc.OOMs; n.OK && n.V > f.ooms[k] {
			f.ooms[k] = n.V
			f.schedule.Failed(k, at)
		}
		fc, ok := f.forecast(r, k, at, free)
		if !ok {
			delete(f.forecasts, k)
			continue
		}
		f.forecasts[k] = fc
		f.last[k] = fc
		if out, ok := f.warning(r, k, fc); ok {
			batch = append(batch, out)
		}
	}
	for k, t := range f.seen {
		if now.Sub(t) > forgetAfter {
			delete(f.seen, k)
			delete(f.forecasts, k)
			delete(f.last, k)
			f.schedule.Forget(k)
			delete(f.ooms, k)
		}
	}
	f.tracker.Retain(func(k diagnosis.Key) bool {
		_, ok := f.seen[k]
		return ok
	})
	f.mu.Unlock()
	if len(batch) > 0 && f.cfg.Clients != nil {
		f.deliver(batch)
	}
}

// forecast measures r's climb at at and says when it reaches r's ceiling.
func (f *Forecaster) forecast(r *attribution.Row, k diagnosis.Key, at time.Time, free map[string]uint64) (diagnosis.Forecast, bool) {
	fr, freeKnown := free[r.UUID]
	ceiling, known := r.Capacity(fr, freeKnown)
	if !known {
		return diagnosis.Forecast{}, false
	}
	limit := r.Alloc.Limit
	isLimit := limit.OK && limit.V > 0 && limit.V == ceiling
	return f.tracker.Forecast(k, at, ceiling, isLimit)
}

// TimeToOOM implements attribution.Forecasts.
func (f *Forecaster) TimeToOOM(pid uint32, start uint64, uuid string) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc, ok := f.forecasts[diagnosis.Key{PID: pid, Start: start, UUID: uuid}]
	if !ok {
		return 0, false
	}
	return uint64(fc.ETA.Seconds()), true
}

// Forecast is the last forecast measured of the process k, if a climb
// was measured while it ran (the one before its failure, for a verdict).
func (f *Forecaster) Forecast(k diagnosis.Key) (diagnosis.Forecast, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc, ok := f.last[k]
	return fc, ok
}

// Trend is k's trend over the window that ends at t.
func (f *Forecaster) Trend(k diagnosis.Key, t time.Time) diagnosis.Trend {
	return f.tracker.Trend(k, t)
}
