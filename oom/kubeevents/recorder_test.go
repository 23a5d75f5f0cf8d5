package kubeevents

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// memorySink keeps Events by name, as the API server would, and applies
// the recorder's patches (count, message, lastTimestamp).
type memorySink struct {
	mu      sync.Mutex
	events  map[string]*corev1.Event
	creates int
	patches int
	block   chan struct{} // when not nil, every call waits for it
}

func newMemorySink() *memorySink { return &memorySink{events: map[string]*corev1.Event{}} }

func (s *memorySink) wait() {
	if s.block != nil {
		<-s.block
	}
}

func (s *memorySink) Create(e *corev1.Event) (*corev1.Event, error) {
	s.wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creates++
	c := e.DeepCopy()
	s.events[c.Namespace+"/"+c.Name] = c
	return c.DeepCopy(), nil
}

func (s *memorySink) Update(e *corev1.Event) (*corev1.Event, error) {
	panic("the recorder does not update Events; the RBAC grants create and patch only")
}

func (s *memorySink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	s.wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.patches++
	old, ok := s.events[e.Namespace+"/"+e.Name]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("events"), e.Name)
	}
	var p struct {
		Count         int32       `json:"count"`
		Message       string      `json:"message"`
		LastTimestamp metav1.Time `json:"lastTimestamp"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, err
	}
	old.Count, old.Message, old.LastTimestamp = p.Count, p.Message, p.LastTimestamp
	return old.DeepCopy(), nil
}

func (s *memorySink) snapshot() []corev1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []corev1.Event
	for _, e := range s.events {
		out = append(out, *e.DeepCopy())
	}
	return out
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func start(t *testing.T, sink *memorySink) *Recorder {
	t.Helper()
	r, err := New(context.Background(), Config{Sink: sink, NodeName: "gpu-node-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

var pod = PodRef{Namespace: "team-a", Name: "train-0", UID: "6b1f3a52-5d0e-4c1e-9f39-2d6c7e3c1a10"}

func TestOOMRecordsAWarningOnThePod(t *testing.T) {
	sink := newMemorySink()
	r := start(t, sink)
	msg := "limit: the request of 3.56 GiB would take the process past its own limit of 7 GiB while the GPU has 135.8 GiB free. Raise the limit or lower the batch."
	r.OOM(pod, msg)
	eventually(t, "the Event", func() bool { return len(sink.snapshot()) == 1 })

	e := sink.snapshot()[0]
	want := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: "6b1f3a52-5d0e-4c1e-9f39-2d6c7e3c1a10"}
	if e.InvolvedObject != want {
		t.Errorf("involvedObject %+v, want %+v", e.InvolvedObject, want)
	}
	if e.Namespace != pod.Namespace {
		t.Errorf("Event in namespace %q, want the pod's %q", e.Namespace, pod.Namespace)
	}
	if e.Type != corev1.EventTypeWarning || e.Reason != "GPUOutOfMemory" || e.Message != msg || e.Count != 1 {
		t.Errorf("type %q reason %q count %d message %q; want Warning GPUOutOfMemory 1 %q", e.Type, e.Reason, e.Count, e.Message, msg)
	}
	if e.Source != (corev1.EventSource{Component: "gpumem-exporter", Host: "gpu-node-1"}) {
		t.Errorf("source %+v, want gpumem-exporter on gpu-node-1", e.Source)
	}
	if e.ReportingController != "gpumem-exporter" || e.ReportingInstance != "gpu-node-1" {
		t.Errorf("reporting controller %q instance %q, want gpumem-exporter gpu-node-1", e.ReportingController, e.ReportingInstance)
	}
}

func TestRepeatsCountOnOneEvent(t *testing.T) {
	sink := newMemorySink()
	r := start(t, sink)
	for range 3 {
		r.OOM(pod, "fragmentation: the process's own inactive memory of 2.0 GiB would cover the request of 2.0 GiB, but no cached block fits.")
	}
	eventually(t, "count 3", func() bool {
		ev := sink.snapshot()
		return len(ev) == 1 && ev[0].Count == 3
	})
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.creates != 1 || sink.patches != 2 {
		t.Errorf("%d creates and %d patches, want 1 create and 2 patches", sink.creates, sink.patches)
	}
}

// Many different OOMs of one pod in a short time fold into one Event, as
// the kubelet's do: the correlator's aggregation.
func TestManySimilarEventsAreAggregated(t *testing.T) {
	sink := newMemorySink()
	r := start(t, sink)
	const n = 20
	for i := range n {
		r.OOM(pod, "growth: request "+strings.Repeat("x", i))
	}
	eventually(t, "the aggregate Event", func() bool {
		for _, e := range sink.snapshot() {
			if strings.HasPrefix(e.Message, "(combined from similar events)") && e.Count >= 2 {
				return true
			}
		}
		return false
	})
	if got := len(sink.snapshot()); got >= n {
		t.Errorf("%d Event objects for %d similar OOMs of one pod, want fewer", got, n)
	}
}

func TestNoEventWithoutAPod(t *testing.T) {
	sink := newMemorySink()
	r := start(t, sink)
	r.OOM(PodRef{}, "outside Kubernetes")
	r.OOM(PodRef{Namespace: "team-a"}, "no pod name")
	r.OOM(PodRef{Name: "train-0"}, "no namespace")
	r.OOM(pod, "the one that counts")
	eventually(t, "the pod's Event", func() bool { return len(sink.snapshot()) == 1 })
	time.Sleep(50 * time.Millisecond)
	if ev := sink.snapshot(); len(ev) != 1 || ev[0].Message != "the one that counts" {
		t.Errorf("Events %+v, want only the pod's", ev)
	}

	var off *Recorder // --no-kubernetes.oom-events
	off.OOM(pod, "ignored")
	off.Stop()
}

func TestOOMNeverBlocksTheCaller(t *testing.T) {
	sink := newMemorySink()
	sink.block = make(chan struct{}) // an API server that never answers
	defer close(sink.block)
	r := start(t, sink)
	done := make(chan struct{})
	go func() {
		for i := range 5000 { // beyond the broadcaster's queue of 1000
			r.OOM(PodRef{Namespace: "ns", Name: "p" + strings.Repeat("x", i%50)}, "m")
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("OOM blocked on an API server that does not answer")
	}
}

func TestLongMessagesAreCut(t *testing.T) {
	sink := newMemorySink()
	r := start(t, sink)
	r.OOM(pod, strings.Repeat("é", 2000))
	eventually(t, "the Event", func() bool { return len(sink.snapshot()) == 1 })
	m := sink.snapshot()[0].Message
	if len(m) > MaxMessageBytes || !utf8.ValidString(m) || !strings.HasSuffix(m, "...") {
		t.Errorf("message of %d bytes (valid UTF-8: %v), want at most %d ending in ...", len(m), utf8.ValidString(m), MaxMessageBytes)
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"eleven char", 10, "eleven ..."},
		{"aé€bc", 7, "aé..."}, // 8 bytes; the cut at byte 4 would split €
		{"€€€", 5, "..."},
	} {
		got := Truncate(tc.in, tc.max)
		if got != tc.want || len(got) > tc.max || !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

// The REST sink writes where the typed client would: POST to the Event's
// namespace, and a strategic merge patch of the Event by name.
func TestSinkWritesToTheEventsNamespace(t *testing.T) {
	type request struct{ method, path, contentType, body string }
	var mu sync.Mutex
	var got []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, request{r.Method, r.URL.Path, r.Header.Get("Content-Type"), string(body)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"apiVersion":"v1","kind":"Event","metadata":{"name":"train-0.1","namespace":"team-a","resourceVersion":"7"},"count":1}`)
	}))
	defer srv.Close()

	sink := NewSink(coreV1Client(t, srv.URL))
	e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "train-0.1", Namespace: "team-a"}, Reason: Reason}
	created, err := sink.Create(e)
	if err != nil {
		t.Fatal(err)
	}
	if created.ResourceVersion != "7" {
		t.Errorf("Create returned %+v, want the server's Event", created.ObjectMeta)
	}
	if _, err := sink.Patch(e, []byte(`{"count":2}`)); err != nil {
		t.Fatal(err)
	}
	want := []request{
		{"POST", "/api/v1/namespaces/team-a/events", "application/json", ""},
		{"PATCH", "/api/v1/namespaces/team-a/events/train-0.1", "application/strategic-merge-patch+json", `{"count":2}`},
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("requests %+v, want %+v", got, want)
	}
	for i := range want {
		g := got[i]
		if i == 0 {
			if !strings.Contains(g.body, `"reason":"GPUOutOfMemory"`) || !strings.Contains(g.body, `"kind":"Event"`) {
				t.Errorf("Create sent %s, want the Event", g.body)
			}
			g.body = ""
		}
		if g != want[i] {
			t.Errorf("request %d: %+v, want %+v", i, g, want[i])
		}
	}
}

// coreV1Client is a JSON core/v1 REST client of the server at url.
func coreV1Client(t *testing.T, url string) rest.Interface {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	metav1.AddToGroupVersion(scheme, corev1.SchemeGroupVersion)
	cfg := &rest.Config{Host: url, ContentConfig: rest.ContentConfig{
		GroupVersion:         &corev1.SchemeGroupVersion,
		ContentType:          "application/json",
		NegotiatedSerializer: serializer.NewCodecFactory(scheme).WithoutConversion(),
	}, APIPath: "/api"}
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The daemon stops the recorder twice: its context ends, and Stop.
func TestStopAfterTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r, err := New(ctx, Config{Sink: newMemorySink(), NodeName: "gpu-node-1"})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	r.Stop()
	r.Stop()
	r.OOM(pod, "after the end: dropped, no panic")
}
