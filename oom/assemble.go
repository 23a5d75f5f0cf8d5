package oom

// The report's assembly: one reading of the join, the device's processes
// as package diagnosis reads them (attribution.Row.DiagnosisProcess), their
// totals, the verdict, and the processes as the report lists them.

import (
	"sort"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/internal/satmath"
)

// MaxReportProcesses bounds the processes listed in one report.
const MaxReportProcesses = 32

// holder is one process on the device while its report is assembled: the
// join's row as a verdict reads it, and what the report says besides.
type holder struct {
	diagnosis.Process
	podUID       string
	listed       bool // NVML lists it on the device
	reporting    bool // it reported the OOM
	contextStale bool // Context is from its last consistent reading
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
		uid:            ev.UID,
		replyTo:        ev.ReplyTo,
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
	hs := r.holders(view.Device(ev.UUID), ev.PID)
	reporter := -1
	for i := range hs {
		h := &hs[i]
		if h.reporting {
			reporter = i
			rep.Comm, rep.Namespace, rep.Pod, rep.Container, rep.PodUID = h.Comm, h.Namespace, h.Pod, h.Container, h.podUID
		}
		if h.listed || h.reporting { // else its own claim: not in the device's totals
			rep.Totals.add(&h.Process)
		}
	}
	rep.Verdict = diagnosis.Diagnose(r.diagnosisInput(ev, &rep, hs, reporter))
	kept, omitted := topHolders(hs, MaxReportProcesses)
	rep.Processes, rep.OmittedProcesses = make([]Process, len(kept)), omitted
	for i := range kept {
		rep.Processes[i] = kept[i].listing()
	}
	if reporter < 0 && r.cfg.Sources.Workload != nil {
		if in, ok := r.cfg.Sources.Workload.Lookup(ev.PID); ok {
			rep.Comm, rep.Namespace, rep.Pod, rep.Container, rep.PodUID = in.Comm, in.Namespace, in.Pod, in.Container, in.PodUID
		}
	}
	return rep
}

// holders are the processes of the device's rows that still run, those
// NVML lists first, then by footprint (largest first) and pid: a process
// that only claims memory never ranks above one NVML sees holding it. A
// row whose reading lags (NVML's used below the allocator's reserved)
// takes its last consistent context, marked stale.
func (r *Reports) holders(rows []attribution.Row, reporter uint32) []holder {
	hs := make([]holder, 0, len(rows))
	for i := range rows {
		row := &rows[i]
		if row.Exited {
			continue // gone before this reading: it holds nothing
		}
		h := holder{Process: row.DiagnosisProcess(), podUID: row.Info.PodUID, listed: row.NVML != nil, reporting: row.PID == reporter}
		if h.Context == nil && row.Alloc != nil && row.NVML != nil {
			if ctx, ok := r.contexts.lastOf(row); ok {
				h.Context, h.contextStale = &ctx, true
			}
		}
		hs = append(hs, h)
	}
	sort.SliceStable(hs, func(i, j int) bool {
		a, b := &hs[i], &hs[j]
		if a.listed != b.listed {
			return a.listed
		}
		if fa, fb := a.Footprint(), b.Footprint(); fa != fb {
			return fa > fb
		}
		return a.PID < b.PID
	})
	return hs
}

// add counts p's figures in the totals.
func (t *Totals) add(p *diagnosis.Process) {
	var inactive *uint64
	if v, ok := p.Inactive(); ok {
		inactive = &v
	}
	for _, f := range []struct {
		sum *uint64
		v   *uint64
	}{
		{&t.ReservedBytes, p.Reserved},
		{&t.ActiveBytes, p.Active},
		{&t.InactiveBytes, inactive},
		{&t.ContextBytes, p.Context},
	} {
		if f.v != nil {
			*f.sum = satmath.Add(*f.sum, *f.v)
		}
	}
}

// listing is h as the report lists it.
func (h *holder) listing() Process {
	p := Process{
		PID:           h.PID,
		Comm:          h.Comm,
		Namespace:     h.Namespace,
		Pod:           h.Pod,
		Container:     h.Container,
		Reporting:     h.reporting,
		NVMLListed:    h.listed,
		UsedBytes:     h.Used,
		ContextBytes:  h.Context,
		ContextStale:  h.contextStale,
		ReservedBytes: h.Reserved,
		ActiveBytes:   h.Active,
	}
	if v, ok := h.Inactive(); ok {
		p.InactiveBytes = &v
	}
	return p
}

// topHolders keeps the first n of hs, and the reporting process if it
// comes later (in place of the n-th), and says how many it left out.
func topHolders(hs []holder, n int) ([]holder, int) {
	if len(hs) <= n {
		return hs, 0
	}
	omitted := len(hs) - n
	for i := n; i < len(hs); i++ {
		if hs[i].reporting {
			hs[n-1] = hs[i]
			break
		}
	}
	return hs[:n:n], omitted
}

// diagnosisInput gathers what the verdict reads: the event, the reporting
// process's allocator at the failure (the stats it sent with the OOM), the
// other processes NVML lists on the device (hs; hs[reporter] is the
// reporting process, reporter < 0 when the reading has none), the
// device's memory and the trend of the process's active memory.
//
// The verdict goes back to the reporting process and into an Event on its
// pod, and any local process can send an oom: it reads the other
// processes (names, pods, figures) only when NVML lists the reporting
// process on the device, and the process's free memory only when NVML's
// reading does not show materially more (freeDisagreement). Otherwise it
// rests on what the process says of its own memory.
func (r *Reports) diagnosisInput(ev allocstats.OOMEvent, rep *Report, hs []holder, reporter int) diagnosis.Input {
	in := diagnosis.Input{
		Requested: ev.Requested,
		Self:      diagnosis.Process{PID: ev.PID},
	}
	in.Trend, in.Forecast = r.trendBefore(ev)
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
	// The process's own limit: from its stats where it sent one; else the
	// OOM's allowed maximum, which is the GPU itself when none is set
	// (Diagnose tells the two apart).
	if ev.Stats.Limit.OK {
		in.Limit = ev.Stats.Limit.Ptr()
	} else if ev.Limit.OK {
		in.Limit = ev.Limit.Ptr()
	}
	listed := false
	if reporter >= 0 {
		in.Self = hs[reporter].Process // no stats with the OOM: the latest
		listed = hs[reporter].listed
	}
	if st := ev.Stats; st.HasStats {
		reserved := st.Reserved
		in.Self.Reserved = &reserved
		in.Self.Active = st.Active.Ptr()
		in.Self.InactiveSplit = st.InactiveSplit.Ptr()
	}
	if !listed {
		return in // the others are not the reporter's business
	}
	for i := range hs {
		if hs[i].listed && i != reporter { // else its own claim: not known to hold anything
			in.Others = append(in.Others, hs[i].Process)
		}
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
