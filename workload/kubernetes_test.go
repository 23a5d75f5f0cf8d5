package workload

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

const testNode = "gpu-node-1"

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

// startInformer runs a PodInformer on client and waits for its first list.
func startInformer(t *testing.T, client *fake.Clientset) (*PodInformer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	p := NewPodInformer(client, testNode, log.NewNopLogger(), reg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p.Run(ctx)
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

func podKnown(p *PodInformer, uid string) func() bool {
	return func() bool { _, _, ok := p.Pod(uid); return ok }
}

func TestPodInformerMapsPodsAndContainers(t *testing.T) {
	client := fake.NewClientset(
		newPod("ml", "trainer-0", podU,
			withInitContainers(status("fetch-weights", "containerd://"+idB)),
			withContainers(status("pytorch", "containerd://"+idA), status("sidecar", "containerd://"+idC)),
			withEphemeralContainers(status("debugger-x7k2p", "containerd://"+idD))),
		newPod("infer", "server-1", podV, withContainers(status("triton", "cri-o://"+idE))),
	)
	p, reg := startInformer(t, client)

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
		if name, ok := p.Container(want.id); !ok || name != want.name {
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

func TestPodInformerFollowsUpdatesAndDeletes(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idA))))
	p, _ := startInformer(t, client)
	pods := client.CoreV1().Pods("ml")

	// The container restarts: a new ID replaces the old one.
	restarted := newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idB)))
	if _, err := pods.UpdateStatus(ctx, restarted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restarted container", func() bool { _, ok := p.Container(idB); return ok })
	if _, ok := p.Container(idA); ok {
		t.Error("the container's old ID is still known after its restart")
	}

	// A pod is added, then the first one is deleted.
	if _, err := client.CoreV1().Pods("infer").Create(ctx, newPod("infer", "server-1", podV), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the added pod", podKnown(p, podV))
	if err := pods.Delete(ctx, "trainer-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod to go", func() bool { return !podKnown(p, podU)() })
	if _, ok := p.Container(idB); ok {
		t.Error("a deleted pod's container is still known")
	}
	waitFor(t, "gpumem_kubernetes_pods to be 1", func() bool { return testutil.ToFloat64(p.podsGauge) == 1 })
}

func TestPodInformerDeleteTombstone(t *testing.T) {
	p := NewPodInformer(fake.NewClientset(), testNode, log.NewNopLogger(), nil)
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
	if _, ok := p.Container(idA); ok {
		t.Error("container still known after a tombstone deletion")
	}
	// Objects of other kinds are ignored, not a panic.
	p.upsert("not a pod")
	p.delete(cache.DeletedFinalStateUnknown{Key: "x", Obj: 42})
}

func TestPodInformerStaticPodFoundByMirror(t *testing.T) {
	const mirrorUID = "0bd1a01d-44b5-5859-9c79-d5e33a584f0a"
	client := fake.NewClientset(newPod("kube-system", "gpu-probe-"+testNode, mirrorUID,
		mirrorOf(podStatic), withContainers(status("probe", "containerd://"+idA))))
	p, _ := startInformer(t, client)
	ns, name, ok := p.Pod(podStatic)
	if !ok || ns != "kube-system" || name != "gpu-probe-"+testNode {
		t.Errorf("Pod(static UID) = %q, %q, %v; want the mirror pod kube-system/gpu-probe-%s", ns, name, ok, testNode)
	}
}

func TestPodInformerIgnoresPodsOfOtherNodes(t *testing.T) {
	p := NewPodInformer(fake.NewClientset(), testNode, log.NewNopLogger(), nil)
	p.upsert(newPod("ml", "elsewhere", podU, onNode("other-node")))
	if podKnown(p, podU)() {
		t.Error("a pod of another node was taken")
	}
}

func TestPodInformerCountsAPIErrors(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	p := NewPodInformer(client, testNode, log.NewNopLogger(), prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.Run(ctx)
	waitFor(t, "gpumem_kubernetes_errors_total to count the failed list", func() bool {
		return testutil.ToFloat64(p.errors) >= 1
	})
	if p.HasSynced() {
		t.Error("HasSynced after only failed lists")
	}
}

func TestPodInformerLookupsBeforeSyncDoNotBlock(t *testing.T) {
	client := fake.NewClientset(newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idA))))
	release := make(chan struct{})
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release // an API server that does not answer
		return false, nil, nil
	})
	defer close(release)
	p := NewPodInformer(client, testNode, log.NewNopLogger(), nil)

	// Before Run, and while the first list hangs.
	check := func(when string) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, _, ok := p.Pod(podU); ok {
				t.Errorf("%s: Pod found before any list", when)
			}
			if _, ok := p.Container(idA); ok {
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
	p.Run(ctx)
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
			var inf atomic.Pointer[PodInformer]
			client, ok, err := NewClient(writeKubeconfig(t, server), func(err error) {
				if p := inf.Load(); p != nil {
					p.RequestFailed(err)
				}
			})
			if err != nil || !ok {
				t.Fatalf("NewClient: %v, %v", ok, err)
			}
			p := NewPodInformer(client, "node-1", log.NewNopLogger(), prometheus.NewRegistry())
			inf.Store(p)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p.Run(ctx)
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
