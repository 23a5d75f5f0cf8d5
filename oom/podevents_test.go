package oom

import (
	"testing"

	"github.com/gpumem/gpumem_exporter/diagnosis"
)

type podEventLog []string

func (l *podEventLog) PodEvent(namespace, name, uid, message string) {
	*l = append(*l, namespace+"/"+name+" "+uid+": "+message)
}

// As a ReportSink, PodEvents puts the report's sentence on the reporting
// process's pod, and nothing for a process outside a pod.
func TestPodEventsPutTheReportOnItsPod(t *testing.T) {
	var got podEventLog
	var sink ReportSink = PodEvents{Recorder: &got}
	rep := Report{GPU: "3", PID: 4242, RequestedBytes: 1 << 30, Namespace: "team-a", Pod: "train-0", PodUID: "6b1f3a52",
		Verdict: diagnosis.Verdict{Cause: diagnosis.Limit, Summary: "It reached its limit.", Remedy: "Raise the limit."}}
	sink.Deliver(rep)
	sink.Deliver(Report{GPU: "3", PID: 7, Verdict: diagnosis.Verdict{Cause: diagnosis.Unknown}}) // no pod: no Event
	want := "team-a/train-0 6b1f3a52: " + rep.Sentence()
	if len(got) != 1 || got[0] != want {
		t.Errorf("Events %q, want one: %q", got, want)
	}
}
