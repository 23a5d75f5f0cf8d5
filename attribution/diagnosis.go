package attribution

// The join's rows as package diagnosis reads them: the one conversion
// that the OOM reports' verdicts and the forecasts share.

import "github.com/gpumem/gpumem_exporter/diagnosis"

// DiagnosisKey is the row's key in the trends (diagnosis.History): its
// process, with the start time the store knows, on its device.
func (r *Row) DiagnosisKey() diagnosis.Key {
	return diagnosis.Key{PID: r.PID, Start: r.AllocStart(), UUID: r.UUID}
}

// DiagnosisProcess is the row as a verdict reads a process: its names,
// NVML's used, its context and its allocator's figures, each nil where
// unknown.
func (r *Row) DiagnosisProcess() diagnosis.Process {
	p := diagnosis.Process{PID: r.PID, Comm: r.Comm, Namespace: r.Info.Namespace, Pod: r.Info.Pod, Container: r.Info.Container}
	if r.NVML != nil && r.NVML.HasUsed {
		used := r.NVML.UsedBytes
		p.Used = &used
	}
	if a := r.Alloc; a != nil {
		reserved := a.Reserved
		p.Reserved = &reserved
		p.Active = a.Active.Ptr()
		p.InactiveSplit = a.InactiveSplit.Ptr()
	}
	if ctx, ok := r.Context(); ok {
		p.Context = &ctx
	}
	return p
}
