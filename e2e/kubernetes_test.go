package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientmodel "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
	"github.com/gpumem/gpumem_exporter/simulate"
)

// End-to-end attribution: real processes push allocator stats over the
// socket; the exporter reads who they are from a fixture procfs
// (--path.procfs) and names their pods through a test Kubernetes API
// server (--kubernetes.kubeconfig).

const (
	attrNode = "node-1"

	attrPodUIDA       = "aaaaaaaa-1111-2222-3333-444444444444"
	attrPodUIDB       = "bbbbbbbb-5555-6666-7777-888888888888"
	attrContainerIDA  = "4f1e6c0d2b9a8e7f4f1e6c0d2b9a8e7f4f1e6c0d2b9a8e7f4f1e6c0d2b9a9a0c"
	attrContainerIDB  = "7c2d5e8f1a3b6c9d7c2d5e8f1a3b6c9d7c2d5e8f1a3b6c9d7c2d5e8f1a3b0b1e"
	attrSlurmJob      = "4242"
	attrFixtureUID    = "1000"
	attrGPU           = 2
	attrGiB           = uint64(1) << 30
	attrClientTimeout = 20 * time.Second
	attrScrapeTimeout = 15 * time.Second
)

// attrRunClient is one instrumented process: the test binary re-executed
// in the client role (init in exporter_test.go) runs it. It waits for "go"
// on stdin (so that the parent can write its procfs fixture first: the
// daemon reads the start time when the connection opens), connects, sends
// hello and one stats message, prints "ready", and stays connected until
// stdin closes.
func attrRunClient(stdin io.Reader, stdout io.Writer) error {
	in := bufio.NewReader(stdin)
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return fmt.Errorf("waiting for go: %q, %v", line, err)
	}
	reserved, err := strconv.ParseUint(os.Getenv("GPUMEM_TEST_RESERVED"), 10, 64)
	if err != nil {
		return err
	}
	active, err := strconv.ParseUint(os.Getenv("GPUMEM_TEST_ACTIVE"), 10, 64)
	if err != nil {
		return err
	}
	conn, err := net.Dial("unix", os.Getenv("GPUMEM_SOCKET"))
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, `{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-e2e/1"}`+"\n"); err != nil {
		return err
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	welcome, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(welcome, `"type":"welcome"`) {
		return fmt.Errorf("no welcome: %q, %v", welcome, err)
	}
	stats := fmt.Sprintf(`{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%d,"active_bytes":%d}]}`+"\n",
		simulate.UUIDs[attrGPU], reserved, active)
	if _, err := io.WriteString(conn, stats); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ready")
	// Stay connected until the parent closes stdin (or gives up on us).
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, in); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
	}
	return nil
}

// attrChild is one running client process (the test binary in the client
// role).
type attrChild struct {
	name     string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	out      *exportertest.SyncBuffer
	waitOnce sync.Once
	waitErr  error
}

// startAttrChild starts a client that waits for "go" before connecting.
func startAttrChild(t *testing.T, name, socket string, reserved, active uint64) *attrChild {
	t.Helper()
	cmd := exportertest.RoleCommand(os.Args[0], "client",
		"GPUMEM_SOCKET="+socket,
		"GPUMEM_TEST_RESERVED="+strconv.FormatUint(reserved, 10),
		"GPUMEM_TEST_ACTIVE="+strconv.FormatUint(active, 10),
	)
	c := &attrChild{name: name, cmd: cmd, out: &exportertest.SyncBuffer{}}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdin = stdin
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.stop(); err != nil && !t.Failed() {
			t.Errorf("client %s: %v; output:\n%s", name, err, c.out.String())
		}
		if t.Failed() {
			t.Logf("client %s (pid %d) output:\n%s", name, c.pid(), c.out.String())
		}
	})
	return c
}

func (c *attrChild) pid() int { return c.cmd.Process.Pid }

// goAndWait lets the client connect and waits until it has sent its stats.
func (c *attrChild) goAndWait(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatalf("client %s: %v", c.name, err)
	}
	if !exportertest.Within(attrClientTimeout, func() bool { return strings.Contains(c.out.String(), "ready\n") }) {
		t.Fatalf("client %s did not connect and report within %s; output:\n%s", c.name, attrClientTimeout, c.out.String())
	}
}

// stop closes the client's stdin, which ends it, and waits; it kills a
// client that does not end within 10s.
func (c *attrChild) stop() error {
	c.waitOnce.Do(func() {
		c.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case c.waitErr = <-done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-done
			c.waitErr = fmt.Errorf("did not exit within 10s of its stdin closing")
		}
	})
	return c.waitErr
}

// attrProc is one process in the fixture procfs.
type attrProc struct {
	startTime uint64
	cgroup    string
}

// writeProcFixture writes <dir>/<pid>/{stat,comm,status,cgroup} as the
// kernel would for a python3 process. Files are replaced atomically, as
// the exporter may read them at any time.
func writeProcFixture(t *testing.T, dir string, pid int, p attrProc) {
	t.Helper()
	pdir := filepath.Join(dir, strconv.Itoa(pid))
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Fields 3 (state) to 52 after "(comm)"; field 22 is the start time.
	stat := fmt.Sprintf("%d (python3) S 1 %d %d 0 -1 4194560 183042 0 12 0 5127 933 0 0 20 0 41 0 %d "+
		"48837165056 1835421 18446744073709551615 94206452350976 94206455061813 140724741017504 0 0 16781312 16386 "+
		"0 0 0 17 11 0 0 0 0 0 94206455798352 94206456105444 94206486474752 140724741023623 140724741023662 "+
		"140724741023662 140724741025767 0\n", pid, pid, pid, p.startTime)
	status := fmt.Sprintf("Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t1\n"+
		"TracerPid:\t0\nUid:\t%s\t%s\t%s\t%s\nGid:\t1000\t1000\t1000\t1000\nFDSize:\t256\nThreads:\t41\n",
		pid, pid, attrFixtureUID, attrFixtureUID, attrFixtureUID, attrFixtureUID)
	for name, content := range map[string]string{
		"comm":   "python3\n",
		"status": status,
		"cgroup": p.cgroup,
		"stat":   stat,
	} {
		tmp := filepath.Join(pdir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(pdir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// attrAPIServer is a Kubernetes API server that knows a few pods and
// serves what a pod informer asks for: list, watch, and the watch-list
// stream (sendInitialEvents) that client-go uses by default.
type attrAPIServer struct {
	*httptest.Server
	pods []corev1.Pod
	// watchList: answer sendInitialEvents watches with the initial pods
	// and the end bookmark; otherwise reject them as an API server without
	// the WatchList feature does, so that the client lists.
	watchList bool
	done      chan struct{}

	mu       sync.Mutex
	requests []string
	problems []string
}

func startAttrAPIServer(t *testing.T, watchList bool, pods ...corev1.Pod) *attrAPIServer {
	t.Helper()
	s := &attrAPIServer{pods: pods, watchList: watchList, done: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		close(s.done) // ends open watches, so that Close does not wait on them
		s.Close()
		if t.Failed() {
			s.mu.Lock()
			t.Logf("API server requests:\n%s", strings.Join(s.requests, "\n"))
			s.mu.Unlock()
		}
	})
	return s
}

func (s *attrAPIServer) note(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problems = append(s.problems, fmt.Sprintf(format, args...))
}

// check reports requests that a node's pod informer should not make.
func (s *attrAPIServer) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.problems {
		t.Error(p)
	}
}

func (s *attrAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r.Method+" "+r.URL.String())
	s.mu.Unlock()
	if r.Method != http.MethodGet || r.URL.Path != "/api/v1/pods" {
		s.note("unexpected request %s %s", r.Method, r.URL)
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	if sel := q.Get("fieldSelector"); sel != "spec.nodeName="+attrNode {
		s.note("pods requested with fieldSelector %q, want spec.nodeName=%s: %s", sel, attrNode, r.URL)
		attrWriteStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "this test server only serves one node's pods")
		return
	}
	if q.Get("watch") != "true" && q.Get("watch") != "1" {
		list := corev1.PodList{
			TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: "1"},
			Items:    s.pods,
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(list)
		return
	}
	initial := q.Get("sendInitialEvents") == "true"
	if initial && !s.watchList {
		attrWriteStatus(w, http.StatusUnprocessableEntity, metav1.StatusReasonInvalid,
			"sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if initial {
		for i := range s.pods {
			enc.Encode(attrWatchEvent{Type: "ADDED", Object: &s.pods[i]})
		}
		enc.Encode(attrWatchEvent{Type: "BOOKMARK", Object: &corev1.Pod{
			TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{
				ResourceVersion: "1",
				Annotations:     map[string]string{metav1.InitialEventsAnnotationKey: "true"},
			},
		}})
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	// Nothing changes: keep the watch open until the client or the test
	// goes away, so that the informer does not spin.
	select {
	case <-r.Context().Done():
	case <-s.done:
	}
}

type attrWatchEvent struct {
	Type   string      `json:"type"`
	Object *corev1.Pod `json:"object"`
}

func attrWriteStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
}

func attrPod(namespace, name, uid, container, containerID string) corev1.Pod {
	return corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, UID: types.UID(uid), ResourceVersion: "1",
			Labels: map[string]string{"app": "trainer"},
		},
		Spec: corev1.PodSpec{
			NodeName:   attrNode,
			Containers: []corev1.Container{{Name: container, Image: "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime"}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: container, Ready: true, ContainerID: "containerd://" + containerID,
				Image: "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime",
			}},
		},
	}
}

// writeKubeconfig points a kubeconfig at server, plain HTTP, no auth.
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
contexts:
- name: test
  context:
    cluster: test
    user: test
current-context: test
users:
- name: test
  user: {}
`, server)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// attrScrape parses one /metrics scrape.
func attrScrape(t *testing.T, e *exportertest.Exporter) (map[string]*clientmodel.MetricFamily, error) {
	t.Helper()
	code, body := e.Get(t, "/metrics")
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics = %d: %.200s", code, body)
	}
	return exportertest.Families(body)
}

func attrLabels(m *clientmodel.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func attrFormatLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, l[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// attrSeriesOf returns the series of family name whose pid label is pid.
func attrSeriesOf(fams map[string]*clientmodel.MetricFamily, name string, pid int) []*clientmodel.Metric {
	var out []*clientmodel.Metric
	for _, m := range fams[name].GetMetric() {
		if attrLabels(m)["pid"] == strconv.Itoa(pid) {
			out = append(out, m)
		}
	}
	return out
}

func attrValue(m *clientmodel.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// attrExpect is what one reporting process must look like in /metrics.
type attrExpect struct {
	name                          string
	pid                           int
	namespace, pod, container     string
	containerID, podUID, slurmJob string
	reserved, active              uint64
}

// workload is the workload label the exporter gives the process: its pod,
// else its Slurm job (every process here is in one or the other).
func (e attrExpect) workload() string {
	if e.pod != "" {
		return e.namespace + "/" + e.pod
	}
	return "slurm job " + e.slurmJob
}

// problems lists how the scrape differs from e; nil when it matches.
func (e attrExpect) problems(fams map[string]*clientmodel.MetricFamily) []string {
	base := map[string]string{
		"gpu": strconv.Itoa(attrGPU), "uuid": simulate.UUIDs[attrGPU], "pid": strconv.Itoa(e.pid),
		"comm": "python3", "namespace": e.namespace, "pod": e.pod, "container": e.container,
		"workload": e.workload(),
	}
	info := map[string]string{
		"container_id": e.containerID, "pod_uid": e.podUID, "slurm_job_id": e.slurmJob,
		"uid": attrFixtureUID, "framework": "pytorch",
	}
	for k, v := range base {
		info[k] = v
	}
	var out []string
	for _, want := range []struct {
		metric string
		labels map[string]string
		value  float64
	}{
		{"gpumem_allocator_reserved_bytes", base, float64(e.reserved)},
		{"gpumem_allocator_active_bytes", base, float64(e.active)},
		{"gpumem_allocator_inactive_bytes", base, float64(e.reserved - e.active)},
		{"gpumem_process_info", info, 1},
	} {
		series := attrSeriesOf(fams, want.metric, e.pid)
		if len(series) != 1 {
			got := make([]string, len(series))
			for i, m := range series {
				got[i] = attrFormatLabels(attrLabels(m))
			}
			out = append(out, fmt.Sprintf("%s: %d series of %s for pid %d, want 1 %s: %v",
				e.name, len(series), want.metric, e.pid, attrFormatLabels(want.labels), got))
			continue
		}
		got := attrLabels(series[0])
		if g, w := attrFormatLabels(got), attrFormatLabels(want.labels); g != w {
			out = append(out, fmt.Sprintf("%s: %s%s, want %s", e.name, want.metric, g, w))
		}
		if v := attrValue(series[0]); v != want.value {
			out = append(out, fmt.Sprintf("%s: %s = %g, want %g", e.name, want.metric, v, want.value))
		}
	}
	return out
}

// gone lists the series of the process that are still served.
func (e attrExpect) gone(fams map[string]*clientmodel.MetricFamily) []string {
	var out []string
	for name := range fams {
		if !strings.HasPrefix(name, "gpumem_") {
			continue
		}
		if n := len(attrSeriesOf(fams, name, e.pid)); n > 0 {
			out = append(out, fmt.Sprintf("%s: %d series of %s for pid %d remain", e.name, n, name, e.pid))
		}
	}
	sort.Strings(out)
	return out
}

func attrGauge(fams map[string]*clientmodel.MetricFamily, name string) (float64, bool) {
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 {
		return 0, false
	}
	return attrValue(f.GetMetric()[0]), true
}

// attrWaitFor scrapes until check finds no problem, or fails the test
// with the last problems.
func attrWaitFor(t *testing.T, e *exportertest.Exporter, what string, check func(map[string]*clientmodel.MetricFamily) []string) map[string]*clientmodel.MetricFamily {
	t.Helper()
	var fams map[string]*clientmodel.MetricFamily
	var problems []string
	if !exportertest.Within(attrScrapeTimeout, func() bool {
		var err error
		if fams, err = attrScrape(t, e); err != nil {
			problems = []string{err.Error()}
		} else {
			problems = check(fams)
		}
		return len(problems) == 0
	}) {
		t.Fatalf("%s: not within %s:\n%s", what, attrScrapeTimeout, strings.Join(problems, "\n"))
	}
	return fams
}

// TestProcessesAreAttributedToTheirPods runs three instrumented processes
// on GPU 2 of the simulated node: two in different Kubernetes pods (one
// cgroup v2 with the systemd driver, one cgroup v1 with the cgroupfs
// driver) and one in a Slurm job. Their identity comes from a fixture
// procfs, their pods from a test API server. Each is attributed on its
// own; a process that exits, or whose pid is reused, loses its series.
func TestProcessesAreAttributedToTheirPods(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		watchList bool
	}{
		{"watch-list", true},
		{"list-then-watch", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testAttribution(t, tc.watchList)
		})
	}
}

func testAttribution(t *testing.T, watchList bool) {
	api := startAttrAPIServer(t, watchList,
		attrPod("ml-team", "trainer-0", attrPodUIDA, "trainer", attrContainerIDA),
		attrPod("ml-team", "trainer-1", attrPodUIDB, "worker", attrContainerIDB),
	)
	procfs := t.TempDir()
	e := startExporter(t,
		"--path.procfs="+procfs,
		"--kubernetes.kubeconfig="+writeKubeconfig(t, api.URL),
		"--kubernetes.node-name="+attrNode,
		// An exited process's counters and process_info stay for the
		// linger (attribution/linger_test.go tests it); a short one here,
		// so that all of A's series go within the wait below.
		"--allocstats.oom-linger=1s",
	)
	e.WaitReady(t) // the daemon accepts stats only for devices NVML listed

	a := startAttrChild(t, "A", e.Socket, 8*attrGiB, 6*attrGiB)
	b := startAttrChild(t, "B", e.Socket, 4*attrGiB, 1*attrGiB)
	c := startAttrChild(t, "C", e.Socket, 2*attrGiB, 2*attrGiB)
	fixtures := map[*attrChild]attrProc{
		// containerd, systemd cgroup driver, cgroup v2: the kubelet writes
		// the pod UID's dashes as underscores in the slice name.
		a: {startTime: 884211, cgroup: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" +
			strings.ReplaceAll(attrPodUIDA, "-", "_") + ".slice/cri-containerd-" + attrContainerIDA + ".scope\n"},
		// cgroupfs driver on cgroup v1 (hybrid: the unified line is empty).
		b: {startTime: 884377, cgroup: strings.Join([]string{
			"12:memory:/kubepods/besteffort/pod" + attrPodUIDB + "/" + attrContainerIDB,
			"11:pids:/kubepods/besteffort/pod" + attrPodUIDB + "/" + attrContainerIDB,
			"4:cpu,cpuacct:/kubepods/besteffort/pod" + attrPodUIDB + "/" + attrContainerIDB,
			"1:name=systemd:/kubepods/besteffort/pod" + attrPodUIDB + "/" + attrContainerIDB,
			"0::/",
		}, "\n") + "\n"},
		// A Slurm step on cgroup v2, no Kubernetes.
		c: {startTime: 901532, cgroup: "0::/system.slice/slurmstepd.scope/job_" + attrSlurmJob + "/step_0/user/task_0\n"},
	}
	// The fixture must exist before a client connects: the daemon reads
	// the start time then.
	for _, child := range []*attrChild{a, b, c} {
		writeProcFixture(t, procfs, child.pid(), fixtures[child])
		child.goAndWait(t)
	}

	wantA := attrExpect{name: "A", pid: a.pid(), namespace: "ml-team", pod: "trainer-0", container: "trainer",
		containerID: attrContainerIDA, podUID: attrPodUIDA, reserved: 8 * attrGiB, active: 6 * attrGiB}
	wantB := attrExpect{name: "B", pid: b.pid(), namespace: "ml-team", pod: "trainer-1", container: "worker",
		containerID: attrContainerIDB, podUID: attrPodUIDB, reserved: 4 * attrGiB, active: 1 * attrGiB}
	wantC := attrExpect{name: "C", pid: c.pid(), slurmJob: attrSlurmJob, reserved: 2 * attrGiB, active: 2 * attrGiB}

	attrWaitFor(t, e, "the three processes attributed", func(fams map[string]*clientmodel.MetricFamily) []string {
		var p []string
		for _, want := range []attrExpect{wantA, wantB, wantC} {
			p = append(p, want.problems(fams)...)
		}
		if v, ok := attrGauge(fams, "gpumem_kubernetes_pods"); !ok || v != 2 {
			p = append(p, fmt.Sprintf("gpumem_kubernetes_pods = %g (present: %t), want 2", v, ok))
		}
		if v, ok := attrGauge(fams, "gpumem_kubernetes_errors_total"); !ok || v != 0 {
			p = append(p, fmt.Sprintf("gpumem_kubernetes_errors_total = %g (present: %t), want 0", v, ok))
		}
		return p
	})

	// A exits and its /proc entry goes: its series go at the next poll
	// (its counters after the linger), without waiting for the TTL after
	// its connection closed.
	if err := a.stop(); err != nil {
		t.Fatalf("client A: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(procfs, strconv.Itoa(a.pid()))); err != nil {
		t.Fatal(err)
	}
	attrWaitFor(t, e, "A's series gone after it exited, B's and C's kept", func(fams map[string]*clientmodel.MetricFamily) []string {
		return append(append(wantA.gone(fams), wantB.problems(fams)...), wantC.problems(fams)...)
	})

	// C's pid now names another process (another start time) while C's
	// connection is still open: the old series must not carry over.
	reused := fixtures[c]
	reused.startTime += 1000
	writeProcFixture(t, procfs, c.pid(), reused)
	attrWaitFor(t, e, "C's series gone after its pid was reused, B's kept", func(fams map[string]*clientmodel.MetricFamily) []string {
		return append(wantC.gone(fams), wantB.problems(fams)...)
	})

	api.check(t)
	for _, line := range strings.Split(e.Log.String(), "\n") {
		if strings.Contains(line, "level=error") {
			t.Errorf("exporter logged an error: %s", line)
		}
	}
}
