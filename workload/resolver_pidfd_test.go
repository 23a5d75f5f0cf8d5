//go:build linux

package workload

import (
	"os/exec"
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

func watchingResolver(t *testing.T) *ProcResolver {
	t.Helper()
	r := NewProcResolver("/proc", nil, nil)
	t.Cleanup(r.Close)
	if !r.Watching() {
		t.Skip("/proc is not this process's pid namespace here")
	}
	return r
}

// A process with a pidfd is not read again while it runs; when it exits
// and is reaped, the next Refresh finds it gone and closes the pidfd.
func TestRefreshWatchesRunningProcessesThroughPidfds(t *testing.T) {
	r := watchingResolver(t)
	pid, stop := startSleeper(t)
	r.Refresh([]uint32{pid})
	info, ok := r.Lookup(pid)
	if !ok || info.StartTime == 0 || info.Comm != "sleep" {
		t.Fatalf("Lookup = %+v, %v", info, ok)
	}
	if r.openFDs != 1 {
		t.Fatalf("%d pidfds held, want 1", r.openFDs)
	}
	reads := r.statRead
	for i := 0; i < 5; i++ {
		r.Refresh([]uint32{pid})
	}
	if r.statRead != reads {
		t.Errorf("5 refreshes of a running watched process read its stat %d times, want 0", r.statRead-reads)
	}
	if alive, known := r.Alive(pid, info.StartTime); !alive || !known {
		t.Errorf("Alive = %v, %v while it runs", alive, known)
	}
	stop(true)
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
	r := watchingResolver(t)
	pid, stop := startSleeper(t)
	r.Refresh([]uint32{pid})
	info, _ := r.Lookup(pid)
	stop(false)
	reads := r.statRead
	r.Refresh([]uint32{pid})
	if r.statRead == reads {
		t.Error("the pidfd of an exited process did not make Refresh read its stat")
	}
	if alive, known := r.Alive(pid, info.StartTime); !alive || !known {
		t.Errorf("Alive = %v, %v for the zombie, want true, true", alive, known)
	}
	if r.openFDs != 1 {
		t.Errorf("%d pidfds held, want the zombie's 1", r.openFDs)
	}
}

// A pid no longer listed gives its pidfd back; past the cap, processes are
// read through /proc at each Refresh.
func TestRefreshBoundsPidfds(t *testing.T) {
	r := watchingResolver(t)
	r.SetMaxPidfds(1)
	a, _ := startSleeper(t)
	b, _ := startSleeper(t)
	r.Refresh([]uint32{a, b})
	if r.openFDs != 1 {
		t.Fatalf("%d pidfds held, want the cap of 1", r.openFDs)
	}
	reads := r.statRead
	r.Refresh([]uint32{a, b})
	if got := r.statRead - reads; got != 1 {
		t.Errorf("a refresh read %d stat files, want 1 (the process past the cap)", got)
	}
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
	if _, ok := r.Lookup(a); ok || r.openFDs != 0 || r.Watching() {
		t.Errorf("after Close: Lookup found %d, %d pidfds held, watching %v", a, r.openFDs, r.Watching())
	}
	r.Refresh([]uint32{a})
	if info, ok := r.Lookup(a); !ok || info.Comm != "sleep" || r.openFDs != 0 {
		t.Errorf("a Refresh after Close: Lookup = %+v, %v, %d pidfds held; want it read through /proc", info, ok, r.openFDs)
	}
	r.SetMaxPidfds(0)
	r.Refresh([]uint32{a})
	if r.openFDs != 0 || r.Watching() {
		t.Errorf("with a cap of 0: %d pidfds held, watching %v", r.openFDs, r.Watching())
	}
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
