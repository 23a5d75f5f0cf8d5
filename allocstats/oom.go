package allocstats

import (
	"encoding/json"
	"net/http"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/gpumem/gpumem_exporter/nvml"
)

// ProcessLabels is what the workload resolver knows about a pid; empty
// strings are unknown.
type ProcessLabels struct {
	Comm      string
	Namespace string
	Pod       string
	Container string
}

// OOMReport is the state of a device when a process on it reported that an
// allocation failed. Processes are ordered by their footprint (the larger
// of NVML used and allocator reserved), largest first.
type OOMReport struct {
	Time           time.Time        `json:"time"`
	GPU            string           `json:"gpu"` // NVML index of the physical GPU; "" if NVML does not list the device
	UUID           string           `json:"uuid"`
	PID            uint32           `json:"pid"`
	Comm           string           `json:"comm"`
	Namespace      string           `json:"namespace"`
	Pod            string           `json:"pod"`
	Container      string           `json:"container"`
	RequestedBytes uint64           `json:"requested_bytes"`
	LimitBytes     *uint64          `json:"limit_bytes,omitempty"`
	FreeBytes      *uint64          `json:"free_bytes,omitempty"`
	Synthetic      bool             `json:"synthetic,omitempty"`
	DeviceMemory   *OOMDeviceMemory `json:"device_memory,omitempty"`
	Totals         OOMTotals        `json:"totals"`
	Processes      []OOMProcess     `json:"processes"`
}

// OOMDeviceMemory is NVML's memory info of the device at the time.
type OOMDeviceMemory struct {
	TotalBytes    uint64  `json:"total_bytes"`
	UsedBytes     uint64  `json:"used_bytes"`
	FreeBytes     uint64  `json:"free_bytes"`
	ReservedBytes *uint64 `json:"reserved_bytes,omitempty"` // driver reservation; absent with NVML's v1 memory info
}

// OOMTotals sums the processes' figures where they are known.
type OOMTotals struct {
	ReservedBytes     uint64  `json:"reserved_bytes"`
	ActiveBytes       uint64  `json:"active_bytes"`
	InactiveBytes     uint64  `json:"inactive_bytes"`
	ContextBytes      uint64  `json:"context_bytes"`
	UnattributedBytes *uint64 `json:"unattributed_bytes,omitempty"`
}

// OOMProcess is one process on the device: every process NVML lists there,
// joined with its allocator stats, and every reporting process NVML does
// not list.
type OOMProcess struct {
	PID           uint32  `json:"pid"`
	Comm          string  `json:"comm"`
	Namespace     string  `json:"namespace"`
	Pod           string  `json:"pod"`
	Container     string  `json:"container"`
	Reporting     bool    `json:"reporting,omitempty"` // the process that reported the OOM
	NVMLListed    bool    `json:"nvml_listed"`
	UsedBytes     *uint64 `json:"used_bytes,omitempty"`    // NVML
	ContextBytes  *uint64 `json:"context_bytes,omitempty"` // used - reserved
	ReservedBytes *uint64 `json:"reserved_bytes,omitempty"`
	ActiveBytes   *uint64 `json:"active_bytes,omitempty"`
	InactiveBytes *uint64 `json:"inactive_bytes,omitempty"`
}

func (p *OOMProcess) footprint() uint64 {
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

// OOMReports keeps the last reports in a ring.
type OOMReports struct {
	snapshot func() *nvml.Snapshot
	store    *Store
	describe func(pid uint32) ProcessLabels
	logger   log.Logger

	mu      sync.Mutex
	ring    []OOMReport
	next    int // where the next report goes
	full    bool
	limiter logLimiter
}

// NewOOMReports returns an empty ring of capacity reports (DefaultOOMReports
// when capacity <= 0). snapshot returns the latest NVML poll (may return
// nil); describe may be nil.
func NewOOMReports(capacity int, snapshot func() *nvml.Snapshot, store *Store, describe func(pid uint32) ProcessLabels, logger log.Logger) *OOMReports {
	if capacity <= 0 {
		capacity = DefaultOOMReports
	}
	if snapshot == nil {
		snapshot = func() *nvml.Snapshot { return nil }
	}
	if describe == nil {
		describe = func(uint32) ProcessLabels { return ProcessLabels{} }
	}
	if logger == nil {
		logger = log.NewNopLogger()
	}
	return &OOMReports{
		snapshot: snapshot,
		store:    store,
		describe: describe,
		logger:   logger,
		ring:     make([]OOMReport, capacity),
		limiter:  logLimiter{burst: 10, every: 6 * time.Second},
	}
}

// Record builds the report of ev, keeps it and logs it. Its method value is
// meant for Config.OnOOM.
func (r *OOMReports) Record(ev OOMEvent) {
	rep := r.build(ev)

	r.mu.Lock()
	r.ring[r.next] = rep
	r.next = (r.next + 1) % len(r.ring)
	if r.next == 0 {
		r.full = true
	}
	// A process that catches OutOfMemoryError in a loop must not flood
	// the log: beyond a burst, reports are logged at debug.
	lvl := level.Debug
	if r.limiter.allow(ev.Time) {
		lvl = level.Warn
	}
	r.mu.Unlock()

	kv := []any{
		"msg", "CUDA out of memory reported",
		"pid", rep.PID, "comm", rep.Comm, "gpu", rep.GPU, "uuid", rep.UUID,
		"requested_bytes", rep.RequestedBytes,
		"active_bytes", rep.Totals.ActiveBytes,
		"inactive_bytes", rep.Totals.InactiveBytes,
		"context_bytes", rep.Totals.ContextBytes,
	}
	if rep.Namespace != "" {
		kv = append(kv, "namespace", rep.Namespace, "pod", rep.Pod, "container", rep.Container)
	}
	if len(rep.Processes) > 0 {
		top := rep.Processes[0]
		kv = append(kv, "top_holder_pid", top.PID, "top_holder_comm", top.Comm, "top_holder_bytes", top.footprint())
	}
	if rep.Synthetic {
		kv = append(kv, "synthetic", true)
	}
	lvl(r.logger).Log(kv...)
}

// build assembles the report of ev from the latest snapshot and the store.
func (r *OOMReports) build(ev OOMEvent) OOMReport {
	rep := OOMReport{
		Time:           ev.Time,
		UUID:           ev.UUID,
		PID:            ev.PID,
		RequestedBytes: ev.Requested,
		LimitBytes:     ev.Limit.Ptr(),
		FreeBytes:      ev.Free.Ptr(),
		Synthetic:      ev.Synthetic,
		Processes:      []OOMProcess{},
	}
	stats := make(map[uint32]DeviceStats)
	if r.store != nil {
		for _, p := range r.store.Processes() {
			if d, ok := p.Device(ev.UUID); ok {
				stats[p.PID] = d
			}
		}
	}
	listed := make(map[uint32]bool)
	dev, ok := r.snapshot().Device(ev.UUID)
	if ok {
		rep.GPU = dev.GPULabel()
		if dev.HasMemory {
			m := dev.Memory
			rep.DeviceMemory = &OOMDeviceMemory{TotalBytes: m.Total, UsedBytes: m.Used, FreeBytes: m.Free}
			if m.HasReserved {
				rep.DeviceMemory.ReservedBytes = &m.Reserved
			}
			if dev.HasProcesses {
				u := dev.Unattributed()
				rep.Totals.UnattributedBytes = &u
			}
		}
		if dev.HasProcesses {
			for _, np := range dev.Processes {
				if listed[np.PID] {
					continue
				}
				listed[np.PID] = true
				p := r.process(np.PID, ev.PID)
				p.NVMLListed = true
				if np.HasUsed {
					used := np.UsedBytes
					p.UsedBytes = &used
				}
				if p.Comm == "" && np.Name != "" {
					p.Comm = path.Base(np.Name)
				}
				if st, ok := stats[np.PID]; ok {
					joinStats(&p, st)
				}
				rep.Processes = append(rep.Processes, p)
			}
		}
	}
	var unlisted []uint32
	for pid := range stats {
		if !listed[pid] {
			unlisted = append(unlisted, pid)
		}
	}
	sort.Slice(unlisted, func(i, j int) bool { return unlisted[i] < unlisted[j] })
	for _, pid := range unlisted {
		p := r.process(pid, ev.PID)
		joinStats(&p, stats[pid])
		rep.Processes = append(rep.Processes, p)
	}
	sort.SliceStable(rep.Processes, func(i, j int) bool {
		a, b := &rep.Processes[i], &rep.Processes[j]
		if fa, fb := a.footprint(), b.footprint(); fa != fb {
			return fa > fb
		}
		return a.PID < b.PID
	})
	for i := range rep.Processes {
		p := &rep.Processes[i]
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
		if p.Reporting {
			rep.Comm, rep.Namespace, rep.Pod, rep.Container = p.Comm, p.Namespace, p.Pod, p.Container
		}
	}
	if rep.Comm == "" && rep.Namespace == "" {
		l := r.describe(ev.PID)
		rep.Comm, rep.Namespace, rep.Pod, rep.Container = l.Comm, l.Namespace, l.Pod, l.Container
	}
	return rep
}

func (r *OOMReports) process(pid, reporter uint32) OOMProcess {
	l := r.describe(pid)
	return OOMProcess{
		PID:       pid,
		Comm:      l.Comm,
		Namespace: l.Namespace,
		Pod:       l.Pod,
		Container: l.Container,
		Reporting: pid == reporter,
	}
}

// joinStats adds a process's allocator stats; context is NVML used minus
// reserved, only when both are known and used >= reserved.
func joinStats(p *OOMProcess, st DeviceStats) {
	if !st.HasStats {
		return
	}
	reserved := st.Reserved
	p.ReservedBytes = &reserved
	p.ActiveBytes = st.Active.Ptr()
	if st.Active.OK {
		inactive := st.Inactive()
		p.InactiveBytes = &inactive
	}
	if p.UsedBytes != nil && *p.UsedBytes >= reserved {
		ctx := *p.UsedBytes - reserved
		p.ContextBytes = &ctx
	}
}

// List returns the kept reports, newest first. The reports are shared and
// must not be modified.
func (r *OOMReports) List() []OOMReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.next
	if r.full {
		n = len(r.ring)
	}
	out := make([]OOMReport, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, r.ring[(r.next-i+len(r.ring))%len(r.ring)])
	}
	return out
}

// ServeHTTP serves {"reports":[…]}, newest first.
func (r *OOMReports) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := json.Marshal(struct {
		Reports []OOMReport `json:"reports"`
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

// logLimiter is a token bucket: burst events at once, then one per every.
type logLimiter struct {
	burst  int
	every  time.Duration
	tokens float64
	last   time.Time
	init   bool
}

func (l *logLimiter) allow(now time.Time) bool {
	if !l.init {
		l.init = true
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
	return false
}
