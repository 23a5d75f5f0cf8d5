// Package oom keeps reports of out-of-memory events: the state of the
// device, process by process, from the attribution join, when a process
// said an allocation failed, with the verdict of package diagnosis.
//
// The route of one event: the allocstats store hands it to Reports
// (ObserveOOM, an allocstats.OOMObserver); the rate limits (limits.go)
// let it through or drop it; the report is assembled from a reading of
// the join taken after the event (assemble.go) and delivered to each
// ReportSink in turn: the ring that /api/v1/oom-reports serves (ring.go),
// the log (log.go), the metrics (metrics.go), the process's own
// connection (verdictline.go), and the sinks of Config (a Kubernetes
// Event on the pod: PodEvents over package oom/kubeevents).
package oom

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// ReportSink takes each report kept, from the goroutine that built it.
// Deliver must not block for long.
type ReportSink interface {
	Deliver(rep Report)
}

// DefaultCapacity is how many reports are kept when none is configured.
const DefaultCapacity = 32

// Config configures Reports.
type Config struct {
	// Capacity is how many reports are kept (DefaultCapacity when <= 0).
	Capacity int
	// Sources is the join a report reads.
	Sources attribution.Sources
	// Fresh, when set, returns an NVML snapshot from a poll that started
	// after the call (nvmlpoll.Poller.Fresh): a report is built from a
	// reading taken after the OOM, not from the poll before the burst that
	// caused it. It is waited for at most FreshTimeout (default 2 s).
	Fresh        func(context.Context) (*nvmlpoll.Snapshot, error)
	FreshTimeout time.Duration
	// Sinks take each report after the ring, the log, the metrics and the
	// process's own connection: the Kubernetes Event, for one.
	Sinks []ReportSink
	// Trends gives each process's trend and forecast before its failure
	// (foresight.Forecaster); nil: verdicts without a trend.
	Trends Trends
	Logger log.Logger
}

// Reports builds a report of each out-of-memory event it observes and
// delivers it to its sinks. It keeps the last reports, at most Capacity
// (see ring), serves them (ServeHTTP), and is a prometheus.Collector of
// the reports' metrics (see metrics).
type Reports struct {
	cfg      Config
	logger   log.Logger
	limits   *limits
	queue    chan allocstats.OOMEvent
	active   atomic.Bool // Run is consuming the queue
	contexts *contexts
	ring     *ring
	metrics  *metrics
	sinks    []ReportSink
}

// New returns Reports that have seen no event.
func New(cfg Config) *Reports {
	if cfg.Capacity <= 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.FreshTimeout <= 0 {
		cfg.FreshTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = log.NewNopLogger()
	}
	r := &Reports{
		cfg:      cfg,
		logger:   cfg.Logger,
		limits:   newLimits(),
		queue:    make(chan allocstats.OOMEvent, queueLength),
		contexts: newContexts(),
		ring:     newRing(cfg.Capacity),
		metrics:  newMetrics(),
	}
	r.metrics.reports = r.ring
	r.sinks = append([]ReportSink{r.ring, newReportLog(cfg.Logger), r.metrics, VerdictReply{}}, cfg.Sinks...)
	return r
}

var _ allocstats.OOMObserver = (*Reports)(nil)

// queueLength bounds the OOM events waiting for their fresh reading.
const queueLength = 64

// ObserveOOM implements allocstats.OOMObserver: it takes an OOM event
// from the store. While the Run loop consumes the queue, the report is
// built in the background from a fresh reading; ObserveOOM never blocks,
// and drops the event when the queue is full. Otherwise it is built at
// once.
func (r *Reports) ObserveOOM(ev allocstats.OOMEvent) {
	if ok, why := r.limits.allow(ev); !ok {
		r.metrics.drop(why)
		level.Debug(r.logger).Log("msg", "OOM event over the report rate; no report", "pid", ev.PID, "uid", ev.UID, "uuid", ev.UUID, "reason", why)
		return
	}
	if r.active.Load() {
		select {
		case r.queue <- ev:
		default:
			r.metrics.drop(dropQueueFull)
			level.Debug(r.logger).Log("msg", "OOM report queue full; event dropped", "pid", ev.PID, "uuid", ev.UUID)
		}
		return
	}
	r.deliver(r.build(ev, r.cfg.Sources.Read()))
}

// Run builds the reports of observed events until ctx ends, each from an
// NVML reading taken after its event arrived. Without Run, ObserveOOM
// builds each report at once from the latest reading.
func (r *Reports) Run(ctx context.Context) {
	r.active.Store(true)
	defer r.active.Store(false)
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-r.queue:
			snap := r.freshSnapshot(ctx)
			r.deliver(r.build(ev, r.cfg.Sources.ReadAt(snap)))
		}
	}
}

func (r *Reports) freshSnapshot(ctx context.Context) *nvmlpoll.Snapshot {
	if r.cfg.Fresh == nil {
		return r.cfg.Sources.Read().Snapshot
	}
	fctx, cancel := context.WithTimeout(ctx, r.cfg.FreshTimeout)
	defer cancel()
	snap, err := r.cfg.Fresh(fctx)
	if err != nil {
		level.Debug(r.logger).Log("msg", "no fresh NVML reading for an OOM report; using the latest", "err", err)
	}
	return snap
}

// deliver hands rep to every sink, in order.
func (r *Reports) deliver(rep Report) {
	for _, s := range r.sinks {
		s.Deliver(rep)
	}
}

// ObserveView remembers each process's context from a consistent reading
// (see contexts); it is fed the join after every poll
// (attribution.Follower).
func (r *Reports) ObserveView(v attribution.View) {
	r.contexts.observe(v)
}

// List returns the kept reports, newest first. The reports are shared and
// must not be modified.
func (r *Reports) List() []Report { return r.ring.list() }
