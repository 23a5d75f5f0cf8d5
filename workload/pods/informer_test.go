package pods

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpumem/gpumem_exporter/workload"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

const testNode = "gpu-node-1"

// Fixture IDs, as in the workload package's cgroup tests.
const (
	idA       = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
	idB       = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
	idC       = "2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6"
	idD       = "18ac3e7343f016890c510e93f935261169d9e3f565436429830faf0934f4f8e4"
	idE       = "3f79bb7b435b05321651daefd374cdc681dc06faa65e374e38337b88ca046dea"
	idF       = "252f10c83610ebca1a059c0bae8255eba2f95be4d1d7bcfa89d7248a82d9f111"
	idG       = "cd0aa9856147b6c5b4ff2b7dfee5da20aa38253099ef1b4a64aced233c9afe29"
	podU      = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
	podV      = "e00dcbd6-facc-5d2d-9da1-eee11a20fe71"
	podStatic = "a81259cef8e959c624df1d456e5d3297"
)

// A nil *Informer is what a caller holds when Kubernetes is off; as a
// workload.PodLookup it must know nothing rather than panic.
func TestNilInformerKnowsNoPods(t *testing.T) {
	var p *Informer
	var lookup workload.PodLookup = p
	if _, _, ok := lookup.Pod(podU); ok {
		t.Error("a nil informer knows a pod")
	}
	if _, _, ok := lookup.Container(idA); ok {
		t.Error("a nil informer knows a container")
	}
}

// podOption changes a test pod.
type podOption func(*corev1.Pod)

func withContainers(statuses ...corev1.ContainerStatus) podOption {
	return func(p *corev1.Pod) { p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, statuses...) }
}

func withInitContainers(statuses ...corev1.ContainerStatus) podOption {
	return func(p *corev1.Pod) {
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, statuses...)
	}
}

func withEphemeralContainers(statuses ...corev1.ContainerStatus) podOption {
	return func(p *corev1.Pod) {
		p.Status.EphemeralContainerStatuses = append(p.Status.EphemeralContainerStatuses, statuses...)
	}
}

func onNode(node string) podOption {
	return func(p *corev1.Pod) { p.Spec.NodeName = node }
}

func mirrorOf(staticUID string) podOption {
	return func(p *corev1.Pod) {
		p.Annotations = map[string]string{mirrorAnnotation: staticUID, "kubernetes.io/config.source": "file"}
	}
}

func status(name, containerID string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, ContainerID: containerID}
}

func newPod(namespace, name, uid string, opts ...podOption) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: testNode},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// podSource is the API server of these tests: a cache.ListerWatcher that
// lists its pods and sends later changes to every watch. Each change gets
// the next resource version, and a watch first replays the changes after
// the version it starts from, so that none made between the informer's
// list and its watch is lost.
type podSource struct {
	// beforeList, when set, runs before every list; an error it returns is
	// the list's.
	beforeList func() error

	mu      sync.Mutex
	pods    map[string]*corev1.Pod // by namespace/name
	version int
	history []watch.Event // every change; history[i] made version initial+i+1
	initial int           // the version of the last pod given to newPodSource
	watches []*watch.RaceFreeFakeWatcher
}

var _ cache.ListerWatcherWithContext = (*podSource)(nil)

func newPodSource(pods ...*corev1.Pod) *podSource {
	s := &podSource{pods: map[string]*corev1.Pod{}}
	for _, p := range pods {
		s.version++
		p = p.DeepCopy()
		p.ResourceVersion = strconv.Itoa(s.version)
		s.pods[p.Namespace+"/"+p.Name] = p
	}
	s.initial = s.version
	return s
}

// IsWatchListSemanticsUnSupported makes the reflector list, then watch
// from the list's version: this source sends no watch list's initial
// events. (TestPodsFromAnAPIServer covers the watch list.)
func (s *podSource) IsWatchListSemanticsUnSupported() bool { return true }

func (s *podSource) List(o metav1.ListOptions) (runtime.Object, error) {
	return s.ListWithContext(context.Background(), o)
}

func (s *podSource) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	if s.beforeList != nil {
		if err := s.beforeList(); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(s.version)}}
	for _, p := range s.pods {
		list.Items = append(list.Items, *p.DeepCopy())
	}
	return list, nil
}

func (s *podSource) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return s.WatchWithContext(context.Background(), o)
}

func (s *podSource) WatchWithContext(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	from, err := strconv.Atoi(o.ResourceVersion)
	if err != nil {
		return nil, fmt.Errorf("watch from resource version %q: %w", o.ResourceVersion, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := watch.NewRaceFreeFake()
	for _, e := range s.history[min(max(0, from-s.initial), len(s.history)):] {
		w.Action(e.Type, e.Object.DeepCopyObject())
	}
	s.watches = append(s.watches, w)
	return w, nil
}

// change stores pod under the next resource version, or removes it for
// watch.Deleted (the event then carries its last state), and sends the
// change to every watch.
func (s *podSource) change(t *testing.T, kind watch.EventType, pod *corev1.Pod) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	key := pod.Namespace + "/" + pod.Name
	stored, exists := s.pods[key]
	switch {
	case kind == watch.Added && exists:
		t.Fatalf("adding pod %s: it exists", key)
	case kind != watch.Added && !exists:
		t.Fatalf("%s pod %s: no such pod", kind, key)
	}
	if kind == watch.Deleted {
		pod = stored
		delete(s.pods, key)
	}
	s.version++
	pod = pod.DeepCopy()
	pod.ResourceVersion = strconv.Itoa(s.version)
	if kind != watch.Deleted {
		s.pods[key] = pod
	}
	s.history = append(s.history, watch.Event{Type: kind, Object: pod})
	for _, w := range s.watches {
		w.Action(kind, pod.DeepCopy())
	}
}

func (s *podSource) add(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	s.change(t, watch.Added, pod)
}

func (s *podSource) update(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	s.change(t, watch.Modified, pod)
}

func (s *podSource) remove(t *testing.T, namespace, name string) {
	t.Helper()
	s.change(t, watch.Deleted, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}})
}

// startInformer runs a Informer on source and waits for its first list.
func startInformer(t *testing.T, source *podSource) (*Informer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	p := New(testNode, log.NewNopLogger())
	reg.MustRegister(p)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p.Run(ctx, source)
	waitFor(t, "the pod watch to sync", p.HasSynced)
	return p, reg
}

// waitFor polls cond until it holds, failing the test after 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func podKnown(p *Informer, uid string) func() bool {
	return func() bool { _, _, ok := p.Pod(uid); return ok }
}

func TestInformerMapsPodsAndContainers(t *testing.T) {
	source := newPodSource(
		newPod("ml", "trainer-0", podU,
			withInitContainers(status("fetch-weights", "containerd://"+idB)),
			withContainers(status("pytorch", "containerd://"+idA), status("sidecar", "containerd://"+idC)),
			withEphemeralContainers(status("debugger-x7k2p", "containerd://"+idD))),
		newPod("infer", "server-1", podV, withContainers(status("triton", "cri-o://"+idE))),
	)
	p, reg := startInformer(t, source)

	pods := []struct{ uid, namespace, name string }{
		{podU, "ml", "trainer-0"},
		{podV, "infer", "server-1"},
	}
	for _, want := range pods {
		ns, name, ok := p.Pod(want.uid)
		if !ok || ns != want.namespace || name != want.name {
			t.Errorf("Pod(%s) = %q, %q, %v; want %s/%s", want.uid, ns, name, ok, want.namespace, want.name)
		}
	}
	containers := []struct{ id, name string }{
		{idA, "pytorch"}, {idC, "sidecar"}, {idB, "fetch-weights"}, {idD, "debugger-x7k2p"}, {idE, "triton"},
	}
	for _, want := range containers {
		if _, name, ok := p.Container(want.id); !ok || name != want.name {
			t.Errorf("Container(%.12s) = %q, %v; want %s", want.id, name, ok, want.name)
		}
	}
	if got := testutil.ToFloat64(p.podsGauge); got != 2 {
		t.Errorf("gpumem_kubernetes_pods = %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "gpumem_kubernetes_pods", "gpumem_kubernetes_errors_total"); err != nil || n != 2 {
		t.Errorf("registry has %d of the two metrics (%v)", n, err)
	}
}

func TestInformerFollowsUpdatesAndDeletes(t *testing.T) {
	source := newPodSource(newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idA))))
	p, _ := startInformer(t, source)

	// The container restarts: a new ID replaces the old one.
	source.update(t, newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idB))))
	waitFor(t, "the restarted container", func() bool { _, _, ok := p.Container(idB); return ok })
	if _, _, ok := p.Container(idA); ok {
		t.Error("the container's old ID is still known after its restart")
	}

	// A pod is added, then the first one is deleted.
	source.add(t, newPod("infer", "server-1", podV))
	waitFor(t, "the added pod", podKnown(p, podV))
	source.remove(t, "ml", "trainer-0")
	waitFor(t, "the deleted pod to go", func() bool { return !podKnown(p, podU)() })
	if _, _, ok := p.Container(idB); ok {
		t.Error("a deleted pod's container is still known")
	}
	waitFor(t, "gpumem_kubernetes_pods to be 1", func() bool { return testutil.ToFloat64(p.podsGauge) == 1 })
}

func TestInformerDeleteTombstone(t *testing.T) {
	p := New(testNode, log.NewNopLogger())
	pod := newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idA)))
	p.upsert(pod)
	if !podKnown(p, podU)() {
		t.Fatal("pod not known after add")
	}
	// The watch missed the deletion; the relist reports it as a tombstone.
	p.delete(cache.DeletedFinalStateUnknown{Key: "ml/trainer-0", Obj: pod})
	if podKnown(p, podU)() {
		t.Error("pod still known after a tombstone deletion")
	}
	if _, _, ok := p.Container(idA); ok {
		t.Error("container still known after a tombstone deletion")
	}
	// Objects of other kinds are ignored, not a panic.
	p.upsert("not a pod")
	p.delete(cache.DeletedFinalStateUnknown{Key: "x", Obj: 42})
}

func TestInformerStaticPodFoundByMirror(t *testing.T) {
	const mirrorUID = "0bd1a01d-44b5-5859-9c79-d5e33a584f0a"
	source := newPodSource(newPod("kube-system", "gpu-probe-"+testNode, mirrorUID,
		mirrorOf(podStatic), withContainers(status("probe", "containerd://"+idA))))
	p, _ := startInformer(t, source)
	ns, name, ok := p.Pod(podStatic)
	if !ok || ns != "kube-system" || name != "gpu-probe-"+testNode {
		t.Errorf("Pod(static UID) = %q, %q, %v; want the mirror pod kube-system/gpu-probe-%s", ns, name, ok, testNode)
	}
	// The container's pod is the UID its cgroup carries: the static pod's.
	if pod, name, ok := p.Container(idA); !ok || pod != podStatic || name != "probe" {
		t.Errorf("Container(%.12s) = %q, %q, %v; want the static pod %s's probe", idA, pod, name, ok, podStatic)
	}
}

func TestInformerIgnoresPodsOfOtherNodes(t *testing.T) {
	p := New(testNode, log.NewNopLogger())
	p.upsert(newPod("ml", "elsewhere", podU, onNode("other-node")))
	if podKnown(p, podU)() {
		t.Error("a pod of another node was taken")
	}
}

func TestInformerCountsAPIErrors(t *testing.T) {
	source := newPodSource()
	source.beforeList = func() error { return errors.New("connection refused") }
	p := New(testNode, log.NewNopLogger())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.Run(ctx, source)
	waitFor(t, "gpumem_kubernetes_errors_total to count the failed list", func() bool {
		return testutil.ToFloat64(p.errors) >= 1
	})
	if p.HasSynced() {
		t.Error("HasSynced after only failed lists")
	}
}

func TestInformerLookupsBeforeSyncDoNotBlock(t *testing.T) {
	source := newPodSource(newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idA))))
	release := make(chan struct{})
	source.beforeList = func() error {
		<-release // an API server that does not answer
		return nil
	}
	defer close(release)
	p := New(testNode, log.NewNopLogger())

	// Before Run, and while the first list hangs.
	check := func(when string) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, _, ok := p.Pod(podU); ok {
				t.Errorf("%s: Pod found before any list", when)
			}
			if _, _, ok := p.Container(idA); ok {
				t.Errorf("%s: Container found before any list", when)
			}
		}()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Fatalf("%s: lookup blocked", when)
		}
	}
	check("before Run")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	p.Run(ctx, source)
	if d := time.Since(start); d > time.Second {
		t.Errorf("Run blocked for %v", d)
	}
	check("during the first list")
	if p.HasSynced() {
		t.Error("HasSynced while the first list hangs")
	}
}

func TestTrimContainerScheme(t *testing.T) {
	tests := []struct{ in, want string }{
		{"containerd://" + idA, idA},
		{"cri-o://" + idA, idA},
		{"docker://" + idA, idA},
		{idA, idA},
		{"", ""},
	}
	for _, tt := range tests {
		if got := trimContainerScheme(tt.in); got != tt.want {
			t.Errorf("trimContainerScheme(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestTrimPodKeepsWhatAttributionNeeds(t *testing.T) {
	pod := newPod("ml", "trainer-0", podU, mirrorOf(podStatic),
		withContainers(corev1.ContainerStatus{Name: "pytorch", ContainerID: "containerd://" + idA, Image: "big/image:tag", RestartCount: 3}))
	pod.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	pod.Spec.Containers = []corev1.Container{{Name: "pytorch", Image: "big/image:tag"}}
	obj, err := trimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*corev1.Pod)
	if got.Name != "trainer-0" || got.Namespace != "ml" || got.UID != podU || got.Spec.NodeName != testNode ||
		got.Annotations[mirrorAnnotation] != podStatic || got.Status.ContainerStatuses[0].ContainerID != "containerd://"+idA {
		t.Errorf("trimPod lost what attribution needs: %+v", got)
	}
	if got.ManagedFields != nil || got.Spec.Containers != nil || got.Status.ContainerStatuses[0].Image != "" {
		t.Errorf("trimPod kept what attribution does not need: %+v", got)
	}
	again, _ := trimPod(got)
	if again.(*corev1.Pod).Annotations[mirrorAnnotation] != podStatic {
		t.Error("trimPod is not idempotent")
	}
	if obj, _ := trimPod("x"); obj != "x" {
		t.Error("trimPod changed an object that is not a pod")
	}
}

func TestNewClient(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: test
  user: {token: abc}
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		kubeconfig  string
		serviceHost string
		wantOK      bool
		wantErr     bool
	}{
		{"a kubeconfig file is used", kubeconfig, "", true, false},
		{"a kubeconfig that cannot be read is an error", filepath.Join(t.TempDir(), "missing"), "", false, true},
		{"outside a cluster, attribution is off without error", "", "", false, false},
		{"in a pod without its service account, an error", "", "10.96.0.1", false, true},
	}
	_, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token")
	inPod := err == nil
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.serviceHost != "" && inPod {
				t.Skip("this test runs in a pod: its service account is there")
			}
			t.Setenv("KUBERNETES_SERVICE_HOST", tt.serviceHost)
			t.Setenv("KUBERNETES_SERVICE_PORT", "443")
			client, ok, err := NewClient(tt.kubeconfig, nil)
			if (err != nil) != tt.wantErr || ok != tt.wantOK || (client != nil) != tt.wantOK {
				t.Errorf("NewClient(%q) = %v, %v, %v; want ok=%v, error: %v", tt.kubeconfig, client, ok, err, tt.wantOK, tt.wantErr)
			}
		})
	}
}

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"" + server + "\"}\n" +
		"users:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// With client-go's watch-list mode, a failing API server never reaches the
// informer's error handler: the client's transport counts the failures.
func TestAnAPIServerThatFailsIsCounted(t *testing.T) {
	unavailable := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "etcd is down", http.StatusServiceUnavailable)
	}))
	defer unavailable.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // connection refused
	for name, server := range map[string]string{"503": unavailable.URL, "no answer": gone.URL} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p, err := Start(ctx, Config{Kubeconfig: writeKubeconfig(t, server), NodeName: "node-1"}, log.NewNopLogger())
			if err != nil || p == nil {
				t.Fatalf("Start: %v, %v", p, err)
			}
			waitFor(t, "gpumem_kubernetes_errors_total to count the failing API server", func() bool {
				return testutil.ToFloat64(p.errors) >= 1
			})
			if _, _, ok := p.Pod("anything"); ok {
				t.Error("a pod known without an API server")
			}
		})
	}
}

type stubRoundTripper struct {
	resp *http.Response
	err  error
}

func (s stubRoundTripper) RoundTrip(*http.Request) (*http.Response, error) { return s.resp, s.err }

func TestErrorReportingTransportCountsWhatMeansTrouble(t *testing.T) {
	for _, tc := range []struct {
		status  int
		err     error
		cancel  bool
		counted bool
	}{
		{status: 200}, {status: 404}, {status: 410}, {status: 422},
		{status: 401, counted: true}, {status: 403, counted: true}, {status: 429, counted: true},
		{status: 500, counted: true}, {status: 503, counted: true},
		{err: errors.New("connection refused"), counted: true},
		{err: context.Canceled, cancel: true},
	} {
		var got []error
		rt := &errorReportingTransport{
			next:    stubRoundTripper{resp: &http.Response{StatusCode: tc.status, Status: http.StatusText(tc.status)}, err: tc.err},
			onError: func(err error) { got = append(got, err) },
		}
		ctx, cancel := context.WithCancel(context.Background())
		if tc.cancel {
			cancel()
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api/api/v1/pods", nil)
		rt.RoundTrip(req)
		cancel()
		if (len(got) == 1) != tc.counted || len(got) > 1 {
			t.Errorf("status %d, err %v, cancelled %v: reported %v, want counted=%v", tc.status, tc.err, tc.cancel, got, tc.counted)
		}
	}
}

// The core/v1 REST client lists and watches the node's pods on an API
// server, in JSON (the server's choice) or as a watch list.
func TestPodsFromAnAPIServer(t *testing.T) {
	pod := `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"trainer-0","namespace":"ml","uid":"` + podU + `","resourceVersion":"10"},` +
		`"spec":{"nodeName":"node-1"},"status":{"containerStatuses":[{"name":"pytorch","containerID":"containerd://` + idA + `"}]}}`
	var selectors sync.Map
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/pods" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		selectors.Store(q.Get("fieldSelector"), true)
		w.Header().Set("Content-Type", "application/json")
		if q.Get("watch") != "true" {
			fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[%s]}`, pod)
			return
		}
		if q.Get("sendInitialEvents") == "true" {
			fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", pod)
			fmt.Fprint(w, `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"10","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n")
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer api.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := Start(ctx, Config{Kubeconfig: writeKubeconfig(t, api.URL), NodeName: "node-1"}, log.NewNopLogger())
	if err != nil || p == nil {
		t.Fatalf("Start: %v, %v", p, err)
	}
	waitFor(t, "the pod from the API server", podKnown(p, podU))
	if _, name, ok := p.Container(idA); !ok || name != "pytorch" {
		t.Errorf("Container(%.12s) = %q, %v; want pytorch", idA, name, ok)
	}
	if _, ok := selectors.Load("spec.nodeName=node-1"); !ok {
		t.Error("the pods were not selected by spec.nodeName")
	}
	if got := testutil.ToFloat64(p.errors); got != 0 {
		t.Errorf("gpumem_kubernetes_errors_total = %v with a working API server", got)
	}
}
