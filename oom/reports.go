// Package oom keeps reports of out-of-memory events: the state of the
// device, process by process, from the attribution join, when a process
// said an allocation failed. It serves them at /api/v1/oom-reports.
package oom

import (
	"encoding/json"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/go-kit/log"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/internal/ratelog"
)

// Report is the state of a device when a process on it reported that an
// allocation failed. Processes are ordered by their footprint (the larger
// of NVML used and allocator reserved), largest first.
type Report struct {
	Time           time.Time     `json:"time"`
	GPU            string        `json:"gpu"` // NVML index of the physical GPU; "" if NVML does not list the device
	UUID           string        `json:"uuid"`
	PID            uint32        `json:"pid"`
	Comm           string        `json:"comm"`
	Namespace      string        `json:"namespace"`
	Pod            string        `json:"pod"`
	Container      string        `json:"container"`
	RequestedBytes uint64        `json:"requested_bytes"`
	LimitBytes     *uint64       `json:"limit_bytes,omitempty"`
	FreeBytes      *uint64       `json:"free_bytes,omitempty"`
	DeviceMemory   *DeviceMemory `json:"device_memory,omitempty"`
	Totals         Totals        `json:"totals"`
	Processes      []Process     `json:"processes"`
}

// DeviceMemory is NVML's memory info of the device at the time.
type DeviceMemory struct {
	TotalBytes    uint64  `json:"total_bytes"`
	UsedBytes     uint64  `json:"used_bytes"`
	FreeBytes     uint64  `json:"free_bytes"`
	ReservedBytes *uint64 `json:"reserved_bytes,omitempty"` // driver reservation; absent with NVML's v1 memory info
}

// Totals sums the processes' figures where they are known.
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

// Reports keeps the last reports in a ring.
type Reports struct {
	src    attribution.Sources
	logger log.Logger
	logs   *ratelog.Limiter

	mu   sync.Mutex
	ring []Report
	next int // where the next report goes
	full bool
}

// New returns an empty ring of capacity reports (DefaultCapacity when
// capacity <= 0) that builds each report from src.
func New(capacity int, src attribution.Sources, logger log.Logger) *Reports {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	if logger == nil {
		logger = log.NewNopLogger()
	}
	return &Reports{
		src:    src,
		logger: logger,
		ring:   make([]Report, capacity),
		// A process that catches OutOfMemoryError in a loop must not
		// flood the log: beyond a burst, reports are logged at debug.
		logs: ratelog.New(10, 6*time.Second),
	}
}

// Record builds the report of ev, keeps it and logs it. Its method value is
// meant for allocstats.Config.OnOOM.
func (r *Reports) Record(ev allocstats.OOMEvent) {
	rep := r.build(ev)

	r.mu.Lock()
	r.ring[r.next] = rep
	r.next = (r.next + 1) % len(r.ring)
	if r.next == 0 {
		r.full = true
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
	r.logs.Warn(r.logger).Log(kv...)
}

// build assembles the report of ev from one reading of the join.
func (r *Reports) build(ev allocstats.OOMEvent) Report {
	rep := Report{
		Time:           ev.Time,
		UUID:           ev.UUID,
		PID:            ev.PID,
		RequestedBytes: ev.Requested,
		LimitBytes:     ev.Limit.Ptr(),
		FreeBytes:      ev.Free.Ptr(),
		Processes:      []Process{},
	}
	view := r.src.Read()
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
		rep.Processes = append(rep.Processes, process(&row, ev.PID))
	}
	sort.SliceStable(rep.Processes, func(i, j int) bool {
		a, b := &rep.Processes[i], &rep.Processes[j]
		if fa, fb := a.footprint(), b.footprint(); fa != fb {
			return fa > fb
		}
		return a.PID < b.PID
	})
	reporterFound := false
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
			reporterFound = true
			rep.Comm, rep.Namespace, rep.Pod, rep.Container = p.Comm, p.Namespace, p.Pod, p.Container
		}
	}
	if !reporterFound && r.src.Workload != nil {
		if in, ok := r.src.Workload.Lookup(ev.PID); ok {
			rep.Comm, rep.Namespace, rep.Pod, rep.Container = in.Comm, in.Namespace, in.Pod, in.Container
		}
	}
	return rep
}

// process is one row of the join as a report lists it.
func process(row *attribution.Row, reporter uint32) Process {
	p := Process{
		PID:        row.PID,
		Comm:       row.Comm,
		Namespace:  row.Info.Namespace,
		Pod:        row.Info.Pod,
		Container:  row.Info.Container,
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
	n := r.next
	if r.full {
		n = len(r.ring)
	}
	out := make([]Report, 0, n)
	for i := 1; i <= n; i++ {
		out = append(out, r.ring[(r.next-i+len(r.ring))%len(r.ring)])
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
