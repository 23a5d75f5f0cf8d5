//go:build linux

package workload

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// startSleeper starts a child that sleeps; stop kills it and reaps it, or,
// with reap false, leaves it a zombie (the test's cleanup reaps it).
func startSleeper(t *testing.T) (pid uint32, stop func(reap bool)) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed, reaped := false, false
	stop = func(reap bool) {
		if !killed {
			killed = true
			cmd.Process.Kill()
		}
		if reap {
			if !reaped {
				reaped = true
				cmd.Wait()
			}
			return
		}
		// Wait, without reaping it, until it is a zombie.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if stat, err := readProcFile("/proc", uint32(cmd.Process.Pid), "stat"); err == nil && zombie(stat) {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatal("the killed child did not become a zombie")
	}
	t.Cleanup(func() { stop(true) })
	return uint32(cmd.Process.Pid), stop
}

// zombie reports whether a stat line's state (field 3) is Z.
func zombie(stat []byte) bool {
	for i := len(stat) - 1; i >= 0; i-- {
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == 'Z'
		}
	}
	return false
}

// mirroredProc is a procfs of this pid namespace (its self names this
// process) whose /proc/<pid> files are copies that a test can take away,
// to see whether a Refresh reads them.
type mirroredProc struct {
	t   *testing.T
	dir string
}

func newMirroredProc(t *testing.T) *mirroredProc {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(strconv.Itoa(os.Getpid()), filepath.Join(dir, "self")); err != nil {
		t.Fatal(err)
	}
	return &mirroredProc{t: t, dir: dir}
}

// copy copies the real /proc/<pid> files the resolver reads.
func (m *mirroredProc) copy(pid uint32) {
	m.t.Helper()
	pidDir := filepath.Join(m.dir, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		m.t.Fatal(err)
	}
	for _, name := range []string{"stat", "comm", "status", "cgroup"} {
		data, err := readProcFile("/proc", pid, name)
		if err != nil {
			m.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pidDir, name), data, 0o644); err != nil {
			m.t.Fatal(err)
		}
	}
}

// hideStat removes the copy of /proc/<pid>/stat: a Refresh that reads it
// then finds the process unreadable (Lookup gives no Comm).
func (m *mirroredProc) hideStat(pid uint32) {
	m.t.Helper()
	if err := os.Remove(filepath.Join(m.dir, strconv.FormatUint(uint64(pid), 10), "stat")); err != nil {
		m.t.Fatal(err)
	}
}

// remove removes the copy of /proc/<pid>, as the kernel does once the
// process is reaped.
func (m *mirroredProc) remove(pid uint32) {
	m.t.Helper()
	if err := os.RemoveAll(filepath.Join(m.dir, strconv.FormatUint(uint64(pid), 10))); err != nil {
		m.t.Fatal(err)
	}
}

func watchingResolver(t *testing.T) (*ProcResolver, *mirroredProc) {
	t.Helper()
	if !sameNamespace("/proc") {
		t.Skip("/proc is not this process's pid namespace here")
	}
	m := newMirroredProc(t)
	r := NewProcResolver(m.dir, nil, nil)
	t.Cleanup(r.Close)
	if !watching(r) {
		t.Skip("no pidfds here")
	}
	return r, m
}

// resolvedComm is the comm Lookup gives for pid: empty when the last
// Refresh could not read the process.
func resolvedComm(r *ProcResolver, pid uint32) string {
	info, _ := r.Lookup(pid)
	return info.Comm
}

// A process with a pidfd is not read again while it runs; when it exits
// and is reaped, the next Refresh finds it gone and closes the pidfd.
func TestRefreshWatchesRunningProcessesThroughPidfds(t *testing.T) {
	r, proc := watchingResolver(t)
	pid, stop := startSleeper(t)
	proc.copy(pid)
	r.Refresh([]uint32{pid})
	info, ok := r.Lookup(pid)
	if !ok || info.StartTime == 0 || info.Comm != "sleep" {
		t.Fatalf("Lookup = %+v, %v", info, ok)
	}
	if r.openFDs != 1 {
		t.Fatalf("%d pidfds held, want 1", r.openFDs)
	}
	proc.hideStat(pid)
	for i := 0; i < 5; i++ {
		r.Refresh([]uint32{pid})
	}
	if comm := resolvedComm(r, pid); comm != "sleep" {
		t.Errorf("5 refreshes of a running watched process read its stat (comm now %q), want no read", comm)
	}
	if alive, known := r.Alive(pid, info.StartTime); !alive || !known {
		t.Errorf("Alive = %v, %v while it runs", alive, known)
	}
	stop(true)
	proc.remove(pid)
	r.Refresh([]uint32{pid})
	if alive, known := r.Alive(pid, info.StartTime); alive || !known {
		t.Errorf("Alive = %v, %v after it exited, want false, true", alive, known)
	}
	if r.openFDs != 0 {
		t.Errorf("%d pidfds held after the process exited, want 0", r.openFDs)
	}
}

// A zombie is still the same process (its pid is not free): it stays
// alive, its pidfd kept, its stat read at each Refresh.
func TestRefreshKeepsAZombieAndItsPidfd(t *testing.T) {
	r, proc := watchingResolver(t)
	pid, stop := startSleeper(t)
	proc.copy(pid)
	r.Refresh([]uint32{pid})
	info, _ := r.Lookup(pid)
	stop(false)
	r.Refresh([]uint32{pid})
	if alive, known := r.Alive(pid, info.StartTime); !alive || !known {
		t.Errorf("Alive = %v, %v for the zombie, want true, true", alive, known)
	}
	if r.openFDs != 1 {
		t.Errorf("%d pidfds held, want the zombie's 1", r.openFDs)
	}
	proc.hideStat(pid)
	r.Refresh([]uint32{pid})
	if comm := resolvedComm(r, pid); comm != "" {
		t.Errorf("the pidfd of an exited process did not make Refresh read its stat (comm still %q)", comm)
	}
}

// A pid no longer listed gives its pidfd back; past the cap, processes are
// read through /proc at each Refresh.
func TestRefreshBoundsPidfds(t *testing.T) {
	r, proc := watchingResolver(t)
	r.SetMaxPidfds(1)
	a, _ := startSleeper(t)
	b, _ := startSleeper(t)
	proc.copy(a)
	proc.copy(b)
	r.Refresh([]uint32{a, b})
	if r.openFDs != 1 {
		t.Fatalf("%d pidfds held, want the cap of 1", r.openFDs)
	}
	proc.hideStat(a)
	proc.hideStat(b)
	r.Refresh([]uint32{a, b})
	if read := btoi(resolvedComm(r, a) == "") + btoi(resolvedComm(r, b) == ""); read != 1 {
		t.Errorf("a refresh read %d stat files, want 1 (the process past the cap)", read)
	}
	proc.copy(a)
	proc.copy(b)
	r.Refresh([]uint32{a, b})
	for _, pid := range []uint32{a, b} {
		if info, ok := r.Lookup(pid); !ok || info.Comm != "sleep" {
			t.Errorf("Lookup(%d) = %+v, %v", pid, info, ok)
		}
	}
	r.Refresh(nil)
	if r.openFDs != 0 {
		t.Errorf("%d pidfds held with no process listed, want 0", r.openFDs)
	}
	r.Refresh([]uint32{a})
	r.Close()
	if _, ok := r.Lookup(a); ok || r.openFDs != 0 || watching(r) {
		t.Errorf("after Close: Lookup found %d, %d pidfds held, watching %v", a, r.openFDs, watching(r))
	}
	r.Refresh([]uint32{a})
	if info, ok := r.Lookup(a); !ok || info.Comm != "sleep" || r.openFDs != 0 {
		t.Errorf("a Refresh after Close: Lookup = %+v, %v, %d pidfds held; want it read through /proc", info, ok, r.openFDs)
	}
	r.SetMaxPidfds(0)
	r.Refresh([]uint32{a})
	if r.openFDs != 0 || watching(r) {
		t.Errorf("with a cap of 0: %d pidfds held, watching %v", r.openFDs, watching(r))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A procfs of another pid namespace (here: a directory that only looks
// like one) is never watched through pidfds.
func TestSameNamespace(t *testing.T) {
	if !sameNamespace("/proc") {
		t.Skip("/proc is not this process's pid namespace here")
	}
	if sameNamespace(t.TempDir()) {
		t.Error("a directory without self counted as this pid namespace")
	}
}

// watching says whether r watches processes through pidfds.
func watching(r *ProcResolver) bool {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	return r.watch && r.maxFDs > 0
}
