package oom

// PodEventRecorder records a Warning Event on a pod (kubeevents.Recorder).
type PodEventRecorder interface {
	PodEvent(namespace, name, uid, message string)
}

// PodEvents is the ReportSink that puts each report's sentence on the
// reporting process's pod as an Event; a process outside a pod gets none.
type PodEvents struct {
	Recorder PodEventRecorder
}

// Deliver implements ReportSink.
func (p PodEvents) Deliver(r Report) {
	if r.Namespace == "" || r.Pod == "" {
		return
	}
	p.Recorder.PodEvent(r.Namespace, r.Pod, r.PodUID, r.Sentence())
}
