package kubeevents

import (
	"testing"

	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/oom"
)

// As an oom.ReportSink, the recorder puts the report's sentence on the
// reporting process's pod, and nothing for a process outside a pod.
func TestDeliverPutsTheReportOnItsPod(t *testing.T) {
	sink := newMemorySink()
	var r oom.ReportSink = start(t, sink)
	rep := oom.Report{GPU: "3", PID: 4242, RequestedBytes: 1 << 30, Namespace: pod.Namespace, Pod: pod.Name, PodUID: pod.UID,
		Verdict: diagnosis.Verdict{Cause: diagnosis.Limit, Summary: "It reached its limit.", Remedy: "Raise the limit."}}
	r.Deliver(rep)
	r.Deliver(oom.Report{GPU: "3", PID: 7, Verdict: diagnosis.Verdict{Cause: diagnosis.Unknown}}) // no pod: no Event
	eventually(t, "the Event", func() bool { return len(sink.snapshot()) == 1 })
	e := sink.snapshot()[0]
	if e.InvolvedObject.Namespace != pod.Namespace || e.InvolvedObject.Name != pod.Name || string(e.InvolvedObject.UID) != pod.UID ||
		e.Reason != Reason || e.Message != rep.Sentence() {
		t.Errorf("Event %+v: want reason %s on %v with the report's sentence %q", e, Reason, pod, rep.Sentence())
	}
}
