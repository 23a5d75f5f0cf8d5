// Package podevents is the old place of oom/kubeevents, which records the
// OOM reports' Events on pods. It stays only as long as
// deploy/apiserver/events_test.go, which another change is moving into the
// deployment's own module, still imports it; delete it when that test
// imports oom/kubeevents.
package podevents

import "github.com/gpumem/gpumem_exporter/oom/kubeevents"

// The names deploy/apiserver's test uses, as kubeevents defines them.
type (
	Recorder = kubeevents.Recorder
	Config   = kubeevents.Config
	PodRef   = kubeevents.PodRef
)

// New is kubeevents.New.
var New = kubeevents.New
