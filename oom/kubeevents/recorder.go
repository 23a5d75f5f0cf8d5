// Package kubeevents records a Kubernetes Event on the pod of a process
// that ran out of GPU memory, as the kubelet records an OOM kill, so that
// `kubectl describe pod` and `kubectl get events` show the verdict. Its
// Recorder is one of the OOM reports' outputs, through oom.PodEvents (it
// imports neither oom nor NVML: the deployment's tests link it alone).
//
// client-go's event recorder does the work: its broadcaster queues events
// (bounded; a full queue drops, never blocks the caller) and its
// correlator counts repeats of one event on one Event object, folds many
// similar events into one, and limits how many a pod gets. What is written
// goes through a core/v1 REST client (Create and Patch of events), not the
// typed clientset, whose scheme registers every API group.
package kubeevents

import (
	"context"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

const (
	// Component is the source of the Events (what `kubectl get events`
	// shows under SOURCE, with the node).
	Component = "gpumem-exporter"
	// Reason is the Events' reason.
	Reason = "GPUOutOfMemory"
	// MaxMessageBytes is the longest message written; a longer one is cut
	// at a character boundary and ends in "...". The kubelet and the
	// events.k8s.io API hold notes to the same size.
	MaxMessageBytes = 1024
	// requestTimeout bounds one write to the API server; the broadcaster
	// retries a write that failed for want of an answer.
	requestTimeout = 10 * time.Second
)

// PodRef names the pod an Event is about. The UID is what `kubectl
// describe pod` selects the pod's Events by: without it the Event is in
// `kubectl get events` only.
type PodRef struct {
	Namespace, Name, UID string
}

// Config says where Events go and who records them.
type Config struct {
	// Client is a REST client of the core/v1 API group (such as
	// pods.NewClient returns). Sink, when set, is used instead (tests).
	Client rest.Interface
	Sink   record.EventSink
	// NodeName is the Events' source host.
	NodeName string
	Logger   log.Logger
	// Correlator tunes aggregation and spam filtering; the zero value
	// is client-go's defaults, as the kubelet uses them.
	Correlator record.CorrelatorOptions
}

// Recorder records OOM Events on pods. Its methods never block on the API
// server.
type Recorder struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	logger      log.Logger
}

// New starts a Recorder; it stops when ctx ends or Stop is called.
func New(ctx context.Context, cfg Config) (*Recorder, error) {
	sink := cfg.Sink
	if sink == nil {
		if cfg.Client == nil {
			return nil, errors.New("kubeevents: no Kubernetes client")
		}
		sink = NewSink(cfg.Client)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = log.NewNopLogger()
	}
	b := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(cfg.Correlator))
	b.StartRecordingToSink(sink)
	// The reference is built here (involvedObject), so the recorder's
	// scheme resolves nothing: an empty one keeps core/v1's out of it.
	rec := b.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: Component, Host: cfg.NodeName})
	return &Recorder{broadcaster: b, recorder: rec, logger: logger}, nil
}

// PodEvent is OOM of the pod namespace/name (uid): it implements
// oom.PodEventRecorder, through which the OOM reports reach it.
func (r *Recorder) PodEvent(namespace, name, uid, message string) {
	r.OOM(PodRef{Namespace: namespace, Name: name, UID: uid}, message)
}

// OOM records a Warning Event with reason GPUOutOfMemory and message on the
// pod. A pod without namespace or name gets none (the process ran outside
// Kubernetes, or its pod is not known). Safe on a nil Recorder (events off).
func (r *Recorder) OOM(pod PodRef, message string) {
	if r == nil || pod.Namespace == "" || pod.Name == "" {
		return
	}
	ref := &corev1.ObjectReference{
		Kind:       "Pod",
		APIVersion: "v1",
		Namespace:  pod.Namespace,
		Name:       pod.Name,
		UID:        types.UID(pod.UID),
	}
	r.recorder.Event(ref, corev1.EventTypeWarning, Reason, Truncate(message, MaxMessageBytes))
	level.Debug(r.logger).Log("msg", "recorded an out-of-memory Event", "namespace", pod.Namespace, "pod", pod.Name)
}

// Stop stops recording; Events still queued are dropped. Safe on nil.
func (r *Recorder) Stop() {
	if r != nil {
		r.broadcaster.Shutdown()
	}
}

// Truncate returns s cut to at most max bytes at a character boundary,
// ending in "..." when cut.
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const ellipsis = "..."
	cut := max - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// sink writes Events through a core/v1 REST client, each into its own
// namespace, as the typed client's EventSinkImpl does. Errors go back
// unwrapped: the broadcaster tells by their type whether to retry.
type sink struct {
	client rest.Interface
}

// NewSink returns an EventSink on a core/v1 REST client.
func NewSink(client rest.Interface) record.EventSink {
	return sink{client: client}
}

func (s sink) Create(e *corev1.Event) (*corev1.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	out := &corev1.Event{}
	err := s.client.Post().Namespace(e.Namespace).Resource("events").Body(e).Do(ctx).Into(out)
	return out, err
}

// Update is never called by the recorder (it creates and patches); it is
// here for the interface, and the RBAC grants no update.
func (s sink) Update(e *corev1.Event) (*corev1.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	out := &corev1.Event{}
	err := s.client.Put().Namespace(e.Namespace).Resource("events").Name(e.Name).Body(e).Do(ctx).Into(out)
	return out, err
}

func (s sink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	out := &corev1.Event{}
	err := s.client.Patch(types.StrategicMergePatchType).Namespace(e.Namespace).Resource("events").Name(e.Name).Body(data).Do(ctx).Into(out)
	return out, err
}
