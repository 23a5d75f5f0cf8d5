package oom

// The report: what one out-of-memory event left on the device, and its
// verdict.

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/diagnosis"
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
	// replyTo is the connection of the reporting process, for its verdict
	// (VerdictReply); the ring keeps the report without it.
	replyTo allocstats.Replier
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
}

// footprint is what the process holds, as the report orders the
// processes by it (diagnosis.Process.Footprint).
func (p *Process) footprint() uint64 {
	return (&diagnosis.Process{Used: p.UsedBytes, Reserved: p.ReservedBytes}).Footprint()
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
