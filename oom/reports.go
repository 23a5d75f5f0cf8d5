// Package oom keeps reports of out-of-memory events: the state of the
// device, process by process, from the attribution join, when a process
// said an allocation failed. It serves them at /api/v1/oom-reports.
package oom

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/internal/ratelog"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// Report is the state of a device when a process on it reported that an
// allocation failed. Processes are ordered by their footprint (the larger
// of NVML used and allocator reserved), largest first, the processes NVML
// lists before those it does not: a process that only claims memory never
// ranks above one NVML sees holding it. At most MaxReportProcesses are
// listed (the reporting process always among them).
type Report struct {
	Time           time.Time `json:"time"`
	GPU            string    `json:"gpu"` // NVML index of the physical GPU; "" if NVML does not list the device
	UUID           string    `json:"uuid"`
	PID            uint32    `json:"pid"`
	Comm           string    `json:"comm"`
	Namespace      string    `json:"namespace"`
	Pod            string    `json:"pod"`
	Container      string    `json:"container"`
	PodUID         string    `json:"pod_uid,omitempty"`
	RequestedBytes uint64    `json:"requested_bytes"`
	// NVMLTime is when the report's NVML reading was taken, and
	// NVMLDelaySeconds how long after the OOM (negative: before it, when no
	// fresh reading came in time).
	NVMLTime         *time.Time    `json:"nvml_time,omitempty"`
	NVMLDelaySeconds *float64      `json:"nvml_delay_seconds,omitempty"`
	LimitBytes       *uint64       `json:"limit_bytes,omitempty"`
	FreeBytes        *uint64       `json:"free_bytes,omitempty"`
	DeviceMemory     *DeviceMemory `json:"device_memory,omitempty"`
	Totals           Totals        `json:"totals"`
	Processes        []Process     `json:"processes"`
	// OmittedProcesses is how many processes were left out of Processes
	// (beyond MaxReportProcesses); Totals still count them.
	OmittedProcesses int `json:"omitted_processes,omitempty"`
	// Verdict says why: the cause, the figures it rests on, the remedy.
	Verdict diagnosis.Verdict `json:"verdict"`

	uid uint32 // of the reporting process, for the ring's per-uid share
}

// DeviceMemory is NVML's memory info of the device at the time.
type DeviceMemory struct {
	TotalBytes    uint64  `json:"total_bytes"`
	UsedBytes     uint64  `json:"used_bytes"`
	FreeBytes     uint64  `json:"free_bytes"`
	ReservedBytes *uint64 `json:"reserved_bytes,omitempty"` // driver reservation; absent with NVML's v1 memory info
}

// Totals sums the figures of the processes NVML lists on the device, and of
// the reporting process, where they are known. A process NVML does not
// list adds nothing: its figures are its own claim.
type Totals struct {
	ReservedBytes     uint64  `json:"reserved_bytes"`
	ActiveBytes       uint64  `json:"active_bytes"`
	InactiveBytes     uint64  `json:"inactive_bytes"`
	ContextBytes      uint64  `json:"context_bytes"`
	UnattributedBytes *uint64 `json:"unattributed_bytes,omitempty"`
}

// Process is one process on the device: every process NVML lists there,
// joined with its allocator stats, and every reporting process NVML does
// not list.
type Process struct {
	PID          uint32  `json:"pid"`
	Comm         string  `json:"comm"`
	Namespace    string  `json:"namespace"`
	Pod          string  `json:"pod"`
	Container    string  `json:"container"`
	Reporting    bool    `json:"reporting,omitempty"` // the process that reported the OOM
	NVMLListed   bool    `json:"nvml_listed"`
	UsedBytes    *uint64 `json:"used_bytes,omitempty"`    // NVML
	ContextBytes *uint64 `json:"context_bytes,omitempty"` // used - reserved
	// ContextStale: NVML's used still lagged the allocator's reserved at
	// the reading, so ContextBytes is from the process's last consistent
	// reading (the context does not change while a process lives).
	ContextStale  bool    `json:"context_stale,omitempty"`
	ReservedBytes *uint64 `json:"reserved_bytes,omitempty"`
	ActiveBytes   *uint64 `json:"active_bytes,omitempty"`
	InactiveBytes *uint64 `json:"inactive_bytes,omitempty"`

	podUID string
}

func (p *Process) footprint() uint64 {
	// The larger of NVML's used and the allocator's reserved: NVML's figure
	// is from the last poll, and a burst just before the failure shows
	// only in the allocator's.
	var f uint64
	if p.UsedBytes != nil {
		f = *p.UsedBytes
	}
	if p.ReservedBytes != nil && *p.ReservedBytes > f {
		f = *p.ReservedBytes
	}
	return f
}

// DefaultCapacity is how many reports are kept when none is configured.
const DefaultCapacity = 32

// Limits on what one process or user can make the daemon keep: an OOM
// caught in a loop, or a flood of made-up oom messages, neither erases the
// other users' reports nor grows the ring's memory.
const (
	// PIDReportInterval: at most one report per process in this long.
	PIDReportInterval = 10 * time.Second
	// UIDReportsPerMinute: at most this many reports per uid in a minute
	// (a burst of as many, then one every 60/N seconds).
	UIDReportsPerMinute = 6
	// MaxReportProcesses bounds the processes listed in one report.
	MaxReportProcesses = 32
)

// Reasons an OOM event gets no report (label reason of
// gpumem_oom_reports_dropped_total).
const (
	dropPIDRate   = "pid_rate"
	dropUIDRate   = "uid_rate"
	dropQueueFull = "queue_full"
)

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
	// OnReport, when set, is called with each report kept (from the
	// goroutine that built it): the Kubernetes Event, for one.
	OnReport func(Report)
	// Trends gives each process's trend and forecast before its failure
	// (foresight.Forecaster); nil: verdicts without a trend.
	Trends Trends
	Logger log.Logger
}

// forecastAge is how old the last forecast before a failure may be for
// its verdict to read it.
const forecastAge = 2 * time.Minute

// Trends is where a verdict reads the trend of the failing process's
// active memory and the last forecast of its time to OOM.
type Trends interface {
	Trend(k diagnosis.Key, at time.Time) diagnosis.Trend
	Forecast(k diagnosis.Key) (diagnosis.Forecast, bool)
}

// Reports keeps the last reports, at most Capacity, oldest first (see keep
// for which goes when it is full). It is a prometheus.Collector of gpumem_oom_reports_dropped_total.
type Reports struct {
	cfg     Config
	logger  log.Logger
	logs    *ratelog.Limiter
	queue   chan allocstats.OOMEvent
	active  atomic.Bool // Run is consuming the queue
	dropped *prometheus.CounterVec
	byCause *prometheus.CounterVec

	limitMu sync.Mutex
	lastPID map[pidKey]time.Time    // last report per process
	uidRate map[uint32]*tokenBucket // report budget per uid

	mu   sync.Mutex
	ring []Report // oldest first

	ctxMu   sync.Mutex
	context map[contextKey]uint64 // last consistent context per process and device
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

type contextKey struct {
	pid   uint32
	start uint64
	uuid  string
}

// New returns an empty ring.
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
		cfg:    cfg,
		logger: cfg.Logger,
		ring:   make([]Report, 0, cfg.Capacity),
		// Many processes running out of memory at once must not flood
		// the log: beyond a burst, reports are logged at debug.
		logs:  ratelog.Path("oom_report", 10, 6*time.Second),
		queue: make(chan allocstats.OOMEvent, queueLength),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_oom_reports_dropped_total",
			Help: "Out-of-memory events that got no report: over the per-process (pid_rate) or per-uid (uid_rate) rate, or with the build queue full (queue_full).",
		}, []string{"reason"}),
		byCause: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_oom_reports_total",
			Help: "Out-of-memory reports, by the cause of their verdict (limit, fragmentation, neighbours, too_large, leak, growth, contexts, unknown).",
		}, []string{"cause"}),
		lastPID: map[pidKey]time.Time{},
		uidRate: map[uint32]*tokenBucket{},
		context: map[contextKey]uint64{},
	}
	for _, reason := range []string{dropPIDRate, dropUIDRate, dropQueueFull} {
		r.dropped.WithLabelValues(reason)
	}
	for _, c := range diagnosis.Causes() {
		r.byCause.WithLabelValues(string(c))
	}
	return r
}

// InfoWindow is how long after a report gpumem_allocator_last_oom_info
// names its cause: longer than the OOM alert's 5-minute window.
const InfoWindow = 10 * time.Minute

var lastOOMInfo = prometheus.NewDesc("gpumem_allocator_last_oom_info",
	"The cause of the process's last out-of-memory report on the GPU (cause: limit, fragmentation, neighbours, too_large, leak, growth, contexts, unknown), for 10 minutes after it.",
	[]string{"gpu", "uuid", "pid", "comm", "namespace", "pod", "container", "cause"}, nil)

// Describe implements prometheus.Collector.
func (r *Reports) Describe(ch chan<- *prometheus.Desc) {
	r.dropped.Describe(ch)
	r.byCause.Describe(ch)
	ch <- lastOOMInfo
}

// Collect implements prometheus.Collector.
func (r *Reports) Collect(ch chan<- prometheus.Metric) {
	r.dropped.Collect(ch)
	r.byCause.Collect(ch)
	type key struct {
		pid  uint32
		uuid string
	}
	seen := map[key]bool{}
	now := time.Now()
	for _, rep := range r.List() { // newest first: the last report wins
		k := key{rep.PID, rep.UUID}
		if seen[k] || now.Sub(rep.Time) > InfoWindow {
			continue
		}
		seen[k] = true
		ch <- prometheus.MustNewConstMetric(lastOOMInfo, prometheus.GaugeValue, 1,
			rep.GPU, rep.UUID, strconv.FormatUint(uint64(rep.PID), 10), rep.Comm, rep.Namespace, rep.Pod, rep.Container, string(rep.Verdict.Cause))
	}
}

// allow applies the per-process and per-uid rates at the event's time, and
// says why not when the event gets no report.
func (r *Reports) allow(ev allocstats.OOMEvent) (bool, string) {
	r.limitMu.Lock()
	defer r.limitMu.Unlock()
	now := ev.Time
	if len(r.lastPID) > 1024 { // forget processes that may report again
		for k, t := range r.lastPID {
			if now.Sub(t) >= PIDReportInterval {
				delete(r.lastPID, k)
			}
		}
	}
	if len(r.uidRate) > 1024 {
		for uid, b := range r.uidRate {
			if now.Sub(b.last) >= time.Minute {
				delete(r.uidRate, uid)
			}
		}
	}
	k := pidKey{ev.PID, ev.StartTime}
	if last, ok := r.lastPID[k]; ok && now.Sub(last) < PIDReportInterval {
		return false, dropPIDRate
	}
	b, ok := r.uidRate[ev.UID]
	if !ok {
		b = &tokenBucket{tokens: UIDReportsPerMinute, last: now}
		r.uidRate[ev.UID] = b
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(UIDReportsPerMinute, b.tokens+d.Minutes()*UIDReportsPerMinute)
		b.last = now
	}
	if b.tokens < 1 {
		return false, dropUIDRate
	}
	b.tokens--
	r.lastPID[k] = now
	return true, ""
}

// queueLength bounds the OOM events waiting for their fresh reading.
const queueLength = 64

// Run builds the reports of recorded events until ctx ends, each from an
// NVML reading taken after its event arrived. Without Run, Record builds
// each report at once from the latest reading.
func (r *Reports) Run(ctx context.Context) {
	r.active.Store(true)
	defer r.active.Store(false)
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-r.queue:
			snap := r.freshSnapshot(ctx)
			r.finish(ev, r.build(ev, r.cfg.Sources.ReadAt(snap)))
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

// ObserveView remembers each process's context from a consistent reading
// (NVML used >= allocator reserved); it is fed the join after every poll
// (attribution.Follower). A report whose fresh reading lags uses it,
// marked stale.
func (r *Reports) ObserveView(v attribution.View) {
	r.ctxMu.Lock()
	defer r.ctxMu.Unlock()
	next := make(map[contextKey]uint64, len(v.Rows))
	for i := range v.Rows {
		row := &v.Rows[i]
		if row.Alloc == nil {
			continue
		}
		k := contextKey{row.PID, row.Info.StartTime, row.UUID}
		if ctx, ok := row.Context(); ok {
			next[k] = ctx
		} else if old, ok := r.context[k]; ok {
			next[k] = old
		}
	}
	r.context = next
}

func (r *Reports) lastContext(row *attribution.Row) (uint64, bool) {
	r.ctxMu.Lock()
	defer r.ctxMu.Unlock()
	ctx, ok := r.context[contextKey{row.PID, row.Info.StartTime, row.UUID}]
	return ctx, ok
}

// Record takes an OOM event (allocstats.Store.OnOOM). While the Run loop
// consumes the queue, the report is built in the background from a fresh
// reading; Record never blocks, and drops the event when the queue is
// full. Otherwise it is built at once.
func (r *Reports) Record(ev allocstats.OOMEvent) {
	if ok, why := r.allow(ev); !ok {
		r.dropped.WithLabelValues(why).Inc()
		level.Debug(r.logger).Log("msg", "OOM event over the report rate; no report", "pid", ev.PID, "uid", ev.UID, "uuid", ev.UUID, "reason", why)
		return
	}
	if r.active.Load() {
		select {
		case r.queue <- ev:
		default:
			r.dropped.WithLabelValues(dropQueueFull).Inc()
			level.Debug(r.logger).Log("msg", "OOM report queue full; event dropped", "pid", ev.PID, "uuid", ev.UUID)
		}
		return
	}
	r.finish(ev, r.build(ev, r.cfg.Sources.Read()))
}

// finish keeps rep, answers the process with its verdict and hands it on.
func (r *Reports) finish(ev allocstats.OOMEvent, rep Report) {
	r.keep(rep)
	r.byCause.WithLabelValues(string(rep.Verdict.Cause)).Inc()
	if ev.Reply != nil {
		if line, err := VerdictLine(rep); err == nil {
			ev.Reply(line)
		}
	}
	if r.cfg.OnReport != nil {
		r.cfg.OnReport(rep)
	}
}

// keep stores rep and logs it. When the ring is full, the oldest report of
// rep's uid goes if that uid holds a quarter of the ring or more, else the
// oldest report of the uid holding the most: one user flooding the ring
// replaces its own reports, never the other users'.
func (r *Reports) keep(rep Report) {
	r.mu.Lock()
	if len(r.ring) == cap(r.ring) {
		held := map[uint32]int{}
		for i := range r.ring {
			held[r.ring[i].uid]++
		}
		from := rep.uid
		if held[from] < max(1, cap(r.ring)/4) {
			for uid, n := range held {
				if n > held[from] || (n == held[from] && uid < from) {
					from = uid
				}
			}
		}
		victim := 0
		for i := range r.ring {
			if r.ring[i].uid == from {
				victim = i
				break
			}
		}
		copy(r.ring[victim:], r.ring[victim+1:])
		r.ring = r.ring[:len(r.ring)-1]
	}
	r.ring = append(r.ring, rep)
	r.mu.Unlock()

	kv := []any{
		"msg", "CUDA out of memory reported",
		"pid", rep.PID, "comm", rep.Comm, "gpu", rep.GPU, "uuid", rep.UUID,
		"cause", rep.Verdict.Cause,
		"requested_bytes", rep.RequestedBytes,
		"active_bytes", rep.Totals.ActiveBytes,
		"inactive_bytes", rep.Totals.InactiveBytes,
		"context_bytes", rep.Totals.ContextBytes,
	}
	if rep.Namespace != "" {
		kv = append(kv, "namespace", rep.Namespace, "pod", rep.Pod, "container", rep.Container)
	}
	if len(rep.Processes) > 0 && rep.Processes[0].NVMLListed {
		top := rep.Processes[0]
		kv = append(kv, "top_holder_pid", top.PID, "top_holder_comm", top.Comm, "top_holder_bytes", top.footprint())
	}
	kv = append(kv, "verdict", rep.Verdict.Summary, "remedy", rep.Verdict.Remedy)
	r.logs.Warn(r.logger).Log(kv...)
}

// build assembles the report of ev from one reading of the join.
func (r *Reports) build(ev allocstats.OOMEvent, view attribution.View) Report {
	rep := Report{
		Time:           ev.Time,
		UUID:           ev.UUID,
		PID:            ev.PID,
		RequestedBytes: ev.Requested,
		LimitBytes:     ev.Limit.Ptr(),
		FreeBytes:      ev.Free.Ptr(),
		Processes:      []Process{},
		uid:            ev.UID,
	}
	if view.Snapshot != nil && !view.Snapshot.Time.IsZero() && !ev.Time.IsZero() {
		t := view.Snapshot.Time
		d := t.Sub(ev.Time).Seconds()
		rep.NVMLTime, rep.NVMLDelaySeconds = &t, &d
	}
	if dev, ok := view.Snapshot.Device(ev.UUID); ok {
		rep.GPU = dev.GPULabel()
		if dev.HasMemory {
			m := dev.Memory
			rep.DeviceMemory = &DeviceMemory{TotalBytes: m.Total, UsedBytes: m.Used, FreeBytes: m.Free}
			if m.HasReserved {
				rep.DeviceMemory.ReservedBytes = &m.Reserved
			}
			if dev.HasProcesses {
				u := dev.Unattributed()
				rep.Totals.UnattributedBytes = &u
			}
		}
	}
	for _, row := range view.Device(ev.UUID) {
		if row.Exited {
			continue // gone before this reading: it holds nothing
		}
		p := process(&row, ev.PID)
		if p.ContextBytes == nil && row.Alloc != nil && row.NVML != nil {
			if ctx, ok := r.lastContext(&row); ok {
				p.ContextBytes, p.ContextStale = &ctx, true
			}
		}
		rep.Processes = append(rep.Processes, p)
	}
	sort.SliceStable(rep.Processes, func(i, j int) bool {
		a, b := &rep.Processes[i], &rep.Processes[j]
		if a.NVMLListed != b.NVMLListed {
			return a.NVMLListed
		}
		if fa, fb := a.footprint(), b.footprint(); fa != fb {
			return fa > fb
		}
		return a.PID < b.PID
	})
	reporterFound := false
	for i := range rep.Processes {
		p := &rep.Processes[i]
		if p.Reporting {
			reporterFound = true
			rep.Comm, rep.Namespace, rep.Pod, rep.Container, rep.PodUID = p.Comm, p.Namespace, p.Pod, p.Container, p.podUID
		}
		if !p.NVMLListed && !p.Reporting {
			continue // its own claim: not in the device's totals
		}
		for _, f := range []struct {
			sum *uint64
			v   *uint64
		}{
			{&rep.Totals.ReservedBytes, p.ReservedBytes},
			{&rep.Totals.ActiveBytes, p.ActiveBytes},
			{&rep.Totals.InactiveBytes, p.InactiveBytes},
			{&rep.Totals.ContextBytes, p.ContextBytes},
		} {
			if f.v != nil {
				*f.sum = addSat(*f.sum, *f.v)
			}
		}
	}
	rep.Verdict = diagnosis.Diagnose(r.diagnosisInput(ev, &rep))
	rep.Processes, rep.OmittedProcesses = topProcesses(rep.Processes, MaxReportProcesses)
	if !reporterFound && r.cfg.Sources.Workload != nil {
		if in, ok := r.cfg.Sources.Workload.Lookup(ev.PID); ok {
			rep.Comm, rep.Namespace, rep.Pod, rep.Container, rep.PodUID = in.Comm, in.Namespace, in.Pod, in.Container, in.PodUID
		}
	}
	return rep
}

// Sentence says in one paragraph what happened and why: the Kubernetes
// Event's message.
func (rep *Report) Sentence() string {
	gpu := rep.GPU
	if gpu == "" {
		gpu = rep.UUID
	}
	v := rep.Verdict
	s := fmt.Sprintf("CUDA out of memory on GPU %s (pid %d tried to allocate %s): %s", gpu, rep.PID, diagnosis.GiB(rep.RequestedBytes), v.Cause)
	if len(v.Contributing) > 0 {
		cs := make([]string, len(v.Contributing))
		for i, c := range v.Contributing {
			cs[i] = string(c)
		}
		s += " (also: " + strings.Join(cs, ", ") + ")"
	}
	return s + ". " + v.Summary + " First: " + v.Remedy
}

// diagnosisInput gathers what the verdict reads: the event, the reporting
// process's allocator at the failure (the stats it sent with the OOM), the
// other processes NVML lists on the device, the device's memory and the
// trend of the process's active memory.
//
// The verdict goes back to the reporting process and into an Event on its
// pod, and any local process can send an oom: it reads the other
// processes (names, pods, figures) only when NVML lists the reporting
// process on the device, and the process's free memory only when NVML's
// reading does not show materially more (freeDisagreement). Otherwise it
// rests on what the process says of its own memory.
func (r *Reports) diagnosisInput(ev allocstats.OOMEvent, rep *Report) diagnosis.Input {
	in := diagnosis.Input{
		Requested: ev.Requested,
		Self:      diagnosis.Process{PID: ev.PID},
	}
	if t := r.cfg.Trends; t != nil {
		// The trend ends at the failure on the samples' own clock (the
		// simulated node's when simulated): the stats sent with the OOM.
		end := ev.Time
		if ev.Stats.HasStats && !ev.Stats.SampledAt.IsZero() {
			end = ev.Stats.SampledAt
		}
		k := diagnosis.Key{PID: ev.PID, Start: ev.StartTime, UUID: ev.UUID}
		in.Trend = t.Trend(k, end)
		if !in.Trend.OK() {
			// Noted without a start time: the store did not know it.
			k.Start = 0
			in.Trend = t.Trend(k, end)
		}
		if fc, ok := t.Forecast(k); ok && end.Sub(fc.At) <= forecastAge {
			in.Forecast = &fc
		}
	}
	if m := rep.DeviceMemory; m != nil {
		in.Total = m.TotalBytes
		if m.ReservedBytes != nil {
			in.DriverReserved = *m.ReservedBytes
		}
		free := m.FreeBytes
		in.Free = &free
	}
	if ev.Free.OK && (in.Free == nil || *in.Free <= ev.Free.V || *in.Free-ev.Free.V <= max(ev.Requested, freeDisagreement)) {
		in.Free = ev.Free.Ptr()
	}
	listed := false
	for i := range rep.Processes {
		listed = listed || (rep.Processes[i].Reporting && rep.Processes[i].NVMLListed)
	}
	// The process's own limit: from its stats where it sent one; else the
	// OOM's allowed maximum, which is the GPU itself when none is set
	// (Diagnose tells the two apart).
	if ev.Stats.Limit.OK {
		in.Limit = ev.Stats.Limit.Ptr()
	} else if ev.Limit.OK {
		in.Limit = ev.Limit.Ptr()
	}
	if st := ev.Stats; st.HasStats {
		reserved := st.Reserved
		in.Self.Reserved = &reserved
		in.Self.Active = st.Active.Ptr()
		in.Self.InactiveSplit = st.InactiveSplit.Ptr()
	}
	for i := range rep.Processes {
		p := &rep.Processes[i]
		if p.Reporting {
			in.Self.Comm, in.Self.Namespace, in.Self.Pod, in.Self.Container = p.Comm, p.Namespace, p.Pod, p.Container
			in.Self.Used, in.Self.Context = p.UsedBytes, p.ContextBytes
			if in.Self.Reserved == nil { // no stats with the OOM: the latest
				in.Self.Reserved, in.Self.Active = p.ReservedBytes, p.ActiveBytes
			}
			continue
		}
		if !p.NVMLListed || !listed {
			continue // its own claim: not known to hold anything; or not the reporter's business
		}
		o := diagnosis.Process{PID: p.PID, Comm: p.Comm, Namespace: p.Namespace, Pod: p.Pod, Container: p.Container,
			Used: p.UsedBytes, Context: p.ContextBytes, Reserved: p.ReservedBytes, Active: p.ActiveBytes}
		in.Others = append(in.Others, o)
	}
	return in
}

// freeDisagreement is how much more free memory NVML's reading, taken
// just after the failure, may show than the oom message says (beyond the
// allocation that failed) before the message's figure gives way to
// NVML's: what moves between the two in the ordinary course (the
// process's own cache returned after the failure, a neighbour's
// allocations) is rarely more, and where it is, NVML's figure is the
// GPU as it is.
const freeDisagreement = 1 << 30

// topProcesses keeps the first n of ps, and the reporting process if it
// comes later (in place of the n-th), and says how many it left out.
func topProcesses(ps []Process, n int) ([]Process, int) {
	if len(ps) <= n {
		return ps, 0
	}
	omitted := len(ps) - n
	for i := n; i < len(ps); i++ {
		if ps[i].Reporting {
			ps[n-1] = ps[i]
			break
		}
	}
	return ps[:n:n], omitted
}

// process is one row of the join as a report lists it.
func process(row *attribution.Row, reporter uint32) Process {
	p := Process{
		PID:        row.PID,
		Comm:       row.Comm,
		Namespace:  row.Info.Namespace,
		Pod:        row.Info.Pod,
		Container:  row.Info.Container,
		podUID:     row.Info.PodUID,
		Reporting:  row.PID == reporter,
		NVMLListed: row.NVML != nil,
	}
	if row.NVML != nil && row.NVML.HasUsed {
		used := row.NVML.UsedBytes
		p.UsedBytes = &used
	}
	if a := row.Alloc; a != nil {
		reserved := a.Reserved
		p.ReservedBytes = &reserved
		p.ActiveBytes = a.Active.Ptr()
		if a.Active.OK {
			inactive := a.Inactive()
			p.InactiveBytes = &inactive
		}
	}
	if ctx, ok := row.Context(); ok {
		p.ContextBytes = &ctx
	}
	return p
}

func addSat(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// List returns the kept reports, newest first. The reports are shared and
// must not be modified.
func (r *Reports) List() []Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Report, len(r.ring))
	for i := range r.ring {
		out[len(r.ring)-1-i] = r.ring[i]
	}
	return out
}

// ServeHTTP serves {"reports":[…]}, newest first.
func (r *Reports) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := json.Marshal(struct {
		Reports []Report `json:"reports"`
	}{r.List()})
	if err != nil {
		http.Error(w, "encoding reports: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if req.Method == http.MethodHead {
		return
	}
	w.Write(append(body, '\n'))
}
