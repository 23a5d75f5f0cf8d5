package workload

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/gpumem/gpumem_exporter/internal/procfixture"
)

// mapPods is a PodLookup backed by maps; safe for concurrent use.
type mapPods struct {
	mu         sync.Mutex
	pods       map[string][2]string
	containers map[string]string
}

func (m *mapPods) Pod(uid string) (string, string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pods[uid]
	return p[0], p[1], ok
}

// Container finds "<pod uid>/<name>" in containers.
func (m *mapPods) Container(id string) (string, string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.containers[id]
	pod, name, _ := strings.Cut(v, "/")
	return pod, name, ok
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newTestResolver(t *testing.T, procPath string, pods PodLookup) (*ProcResolver, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	return NewProcResolver(procPath, pods, log.NewLogfmtLogger(logs)), logs
}

func (r *ProcResolver) cachedCount() int { return len(*r.cache.Load()) }

func TestResolverReadsProcessOnFirstRefresh(t *testing.T) {
	dir := t.TempDir()
	writeProcess(t, dir, 100, fakeProcess{Comm: "python3", Start: 5000, UID: "1000", Cgroup: "0::/system.slice/docker-" + idD + ".scope\n"})
	r, _ := newTestResolver(t, dir, nil)

	if _, ok := r.Lookup(100); ok {
		t.Fatal("Lookup before any Refresh found pid 100")
	}
	r.Refresh([]uint32{100})
	got, ok := r.Lookup(100)
	want := Info{PID: 100, StartTime: 5000, Comm: "python3", UID: "1000", Cgroup: "/system.slice/docker-" + idD + ".scope", ContainerID: idD}
	if !ok || got != want {
		t.Errorf("Lookup(100) = %+v, %v\nwant %+v, true", got, ok, want)
	}
}

func TestResolverLookupServesFromCacheWithoutProc(t *testing.T) {
	dir := t.TempDir()
	writeProcess(t, dir, 100, fakeProcess{Comm: "python3", Start: 5000, UID: "1000", Cgroup: "0::/\n"})
	r, _ := newTestResolver(t, dir, nil)
	r.Refresh([]uint32{100})

	if err := os.RemoveAll(filepath.Join(dir, "100")); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Lookup(100); !ok || got.Comm != "python3" {
		t.Errorf("Lookup after /proc/100 vanished = %+v, %v; want the cached python3", got, ok)
	}
}

func TestResolverRereadsOnlyWhenStartTimeChanges(t *testing.T) {
	dir := t.TempDir()
	writeProcess(t, dir, 100, fakeProcess{Comm: "python3", Start: 5000, UID: "1000", Cgroup: "0::/\n"})
	r, _ := newTestResolver(t, dir, nil)
	r.Refresh([]uint32{100})

	// comm changes (prctl PR_SET_NAME) but the process is the same: the
	// cached details stay, and only stat was read.
	writeProcFile(t, dir, 100, "comm", "renamed\n")
	r.Refresh([]uint32{100})
	if got, _ := r.Lookup(100); got.Comm != "python3" {
		t.Errorf("same start time: Comm = %q, want the cached python3", got.Comm)
	}

	// The pid is reused by another process.
	writeProcess(t, dir, 100, fakeProcess{Comm: "bash", Start: 9000, UID: "0", Cgroup: "0::/user.slice/user-0.slice/session-1.scope\n"})
	r.Refresh([]uint32{100})
	got, _ := r.Lookup(100)
	if got.Comm != "bash" || got.StartTime != 9000 || got.UID != "0" {
		t.Errorf("reused pid: Lookup = %+v; want bash, start 9000, uid 0", got)
	}
}

func TestResolverForgetsPidsNotListed(t *testing.T) {
	dir := t.TempDir()
	for _, pid := range []uint32{100, 200} {
		writeProcess(t, dir, pid, fakeProcess{Comm: "python3", Start: 1, UID: "1000", Cgroup: "0::/\n"})
	}
	r, _ := newTestResolver(t, dir, nil)
	r.Refresh([]uint32{100, 200, 100})
	if n := r.cachedCount(); n != 2 {
		t.Errorf("after Refresh(100, 200, 100): %d cached, want 2", n)
	}
	r.Refresh([]uint32{200})
	if _, ok := r.Lookup(100); ok {
		t.Error("pid 100 still found after a Refresh that did not list it")
	}
	if _, ok := r.Lookup(200); !ok {
		t.Error("pid 200 lost although listed")
	}
	r.Refresh(nil)
	if n := r.cachedCount(); n != 0 {
		t.Errorf("after Refresh(nil): %d cached, want 0", n)
	}
}

func TestResolverKeepsNegativeEntryForVanishedPid(t *testing.T) {
	dir := t.TempDir()
	r, logs := newTestResolver(t, dir, nil)
	r.Refresh([]uint32{300})
	got, ok := r.Lookup(300)
	if !ok || got != (Info{PID: 300}) {
		t.Errorf("Lookup of a vanished pid = %+v, %v; want PID only, true", got, ok)
	}
	if strings.Contains(logs.String(), "level=warn") || strings.Contains(logs.String(), "level=error") {
		t.Errorf("a vanished pid was logged above debug:\n%s", logs.String())
	}

	// It comes back (NVML listed it before /proc had it): the next
	// Refresh resolves it.
	writeProcess(t, dir, 300, fakeProcess{Comm: "python3", Start: 1, UID: "1000", Cgroup: "0::/\n"})
	r.Refresh([]uint32{300})
	if got, _ := r.Lookup(300); got.Comm != "python3" {
		t.Errorf("after the pid appeared: Comm = %q, want python3", got.Comm)
	}
}

func TestResolverKeepsWhatItCouldRead(t *testing.T) {
	dir := t.TempDir()
	writeProcess(t, dir, 100, fakeProcess{Comm: "python3", Start: 5, UID: "1000", Cgroup: "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n"})
	writeProcFile(t, dir, 100, "status", "Name:\tpython3\n") // no Uid: line
	r, logs := newTestResolver(t, dir, nil)
	r.Refresh([]uint32{100})
	got, _ := r.Lookup(100)
	if got.Comm != "python3" || got.SlurmJobID != "7" || got.UID != "" {
		t.Errorf("Lookup with an unreadable uid = %+v; want comm and job, no uid", got)
	}
	if !strings.Contains(logs.String(), "level=warn") {
		t.Errorf("a partly unreadable process was not logged as a warning:\n%s", logs.String())
	}
}

func TestResolverNamesKubernetesObjectsAtLookup(t *testing.T) {
	dir := t.TempDir()
	writeProcess(t, dir, 100, fakeProcess{Comm: "python3", Start: 5, UID: "1000",
		Cgroup: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice/cri-containerd-" + idA + ".scope\n"})
	pods := &mapPods{pods: map[string][2]string{}, containers: map[string]string{}}
	r, _ := newTestResolver(t, dir, pods)
	r.Refresh([]uint32{100})

	got, _ := r.Lookup(100)
	if got.PodUID != podU || got.ContainerID != idA || got.Pod != "" || got.Container != "" {
		t.Errorf("before the pod is known: %+v; want IDs without names", got)
	}

	// The informer learns the pod after the process was resolved: the
	// names show without another Refresh.
	pods.mu.Lock()
	pods.pods[podU] = [2]string{"ml", "trainer-0"}
	pods.containers[idA] = podU + "/pytorch"
	pods.mu.Unlock()
	got, _ = r.Lookup(100)
	if got.Namespace != "ml" || got.Pod != "trainer-0" || got.Container != "pytorch" {
		t.Errorf("after the pod is known: %+v; want ml/trainer-0/pytorch", got)
	}
}

// TestResolverNamesAContainerOnlyInThePodWhoseStatusListsIt: the
// container ID is world-readable, and the cgroup may say one pod while the
// API server lists the container in another.
func TestResolverNamesAContainerOnlyInThePodWhoseStatusListsIt(t *testing.T) {
	podSlice := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice/cri-containerd-%s.scope\n"
	pods := &mapPods{
		pods:       map[string][2]string{podU: {"ml", "trainer-0"}, podV: {"prod", "bert-finetune-0"}},
		containers: map[string]string{idA: podU + "/pytorch", idF: podV + "/trainer"},
	}
	tests := []struct {
		name   string
		cgroup string
		want   [3]string // namespace, pod, container
	}{
		{"the pod's own container", fmt.Sprintf(podSlice, idA), [3]string{"ml", "trainer-0", "pytorch"}},
		{"a container the pod's status does not list yet", fmt.Sprintf(podSlice, idB), [3]string{"ml", "trainer-0", ""}},
		{"another pod's container", fmt.Sprintf(podSlice, idF), [3]string{}},
		{"a pod's container claimed by a process in no pod", "0::/system.slice/docker-" + idF + ".scope\n", [3]string{}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			pid := uint32(100 + i)
			writeProcess(t, dir, pid, fakeProcess{Comm: "python3", Start: 5, UID: "1000", Cgroup: tt.cgroup})
			r, _ := newTestResolver(t, dir, pods)
			r.Refresh([]uint32{pid})
			got, _ := r.Lookup(pid)
			if names := [3]string{got.Namespace, got.Pod, got.Container}; names != tt.want {
				t.Errorf("names %q, want %q (%+v)", names, tt.want, got)
			}
		})
	}
}

func TestResolverCapsTheCache(t *testing.T) {
	dir := t.TempDir()
	const max = MaxCachedProcesses
	pids := make([]uint32, max+10)
	for i := range pids {
		pids[i] = uint32(i + 1)
	}
	logs := &syncBuffer{}
	// Info and above: a debug line for each missing pid is not the point.
	r := NewProcResolver(dir, nil, level.NewFilter(log.NewLogfmtLogger(logs), level.AllowInfo()))
	r.Refresh(pids)
	if n := r.cachedCount(); n != max {
		t.Errorf("cache holds %d entries, want the cap %d", n, max)
	}
	r.Refresh(pids)
	if c := strings.Count(logs.String(), "too many processes"); c != 1 {
		t.Errorf("the cap was logged %d times over two refreshes, want once", c)
	}
}

func TestResolverConcurrentRefreshAndLookup(t *testing.T) {
	dir := t.TempDir()
	pids := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	for _, pid := range pids {
		writeProcess(t, dir, pid, fakeProcess{Comm: "python3", Start: 1, UID: "1000",
			Cgroup: "0::/kubepods/burstable/pod" + podU + "/" + idA + "\n"})
	}
	pods := &mapPods{pods: map[string][2]string{podU: {"ml", "trainer-0"}}, containers: map[string]string{idA: podU + "/pytorch"}}
	r, _ := newTestResolver(t, dir, pods)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, pid := range pids {
					if info, ok := r.Lookup(pid); ok && info.PID != pid {
						t.Errorf("Lookup(%d) returned pid %d", pid, info.PID)
					}
				}
			}
		})
	}
	for i := range 200 {
		r.Refresh(pids[:1+i%len(pids)])
	}
	close(stop)
	wg.Wait()
}

// Alive answers from the last Refresh: a /proc entry that changes after
// it is not read again.
func TestAliveAnswersFromTheLastRefresh(t *testing.T) {
	proc := t.TempDir()
	procfixture.Write(t, proc, 100, procfixture.Process{Comm: "python3", Start: 5000, UID: "0"})
	procfixture.Write(t, proc, 101, procfixture.Process{Comm: "python3", Start: 6000, UID: "0"})
	r, _ := newTestResolver(t, proc, nil)
	r.Refresh([]uint32{100, 101, 102})
	if err := os.RemoveAll(filepath.Join(proc, "100")); err != nil { // exits after the Refresh
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		pid          uint32
		start        uint64
		alive, known bool
	}{
		{"running at the Refresh", 100, 5000, true, true},
		{"any start time", 100, 0, true, true},
		{"another process with the pid", 101, 5999, false, true},
		{"gone at the Refresh", 102, 0, false, true},
		{"not in the Refresh", 103, 0, false, false},
	}
	for _, tt := range tests {
		if alive, known := r.Alive(tt.pid, tt.start); alive != tt.alive || known != tt.known {
			t.Errorf("%s: Alive(%d, %d) = %v, %v; want %v, %v", tt.name, tt.pid, tt.start, alive, known, tt.alive, tt.known)
		}
	}
}
