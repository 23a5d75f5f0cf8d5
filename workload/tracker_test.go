package workload

import (
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/procfixture"
)

// fixedTracker knows the pids in alive, and names them.
type fixedTracker map[uint32]bool

func (f fixedTracker) Lookup(pid uint32) (Info, bool) {
	if _, ok := f[pid]; ok {
		return Info{PID: pid, Comm: "fixed"}, true
	}
	return Info{}, false
}

func (f fixedTracker) Alive(pid uint32, _ uint64) (alive, known bool) {
	alive, known = f[pid]
	return alive, known
}

// The first tracker that knows a pid answers; /proc answers for the rest,
// and a pid nobody can tell about counts as running.
func TestRunningAsksTheTrackersThenProc(t *testing.T) {
	proc := t.TempDir()
	procfixture.Write(t, proc, 100, procfixture.Process{Comm: "python3", Start: 5000, UID: "0"})
	first := fixedTracker{10: true, 11: false}
	second := fixedTracker{10: false, 12: true}
	running := Running(proc, Trackers{first, second})
	for _, tc := range []struct {
		name  string
		pid   uint32
		start uint64
		want  bool
	}{
		{"the first tracker's live pid", 10, 0, true},
		{"the first tracker's exited pid", 11, 0, false},
		{"the second tracker's pid", 12, 0, true},
		{"a pid /proc lists with its start time", 100, 5000, true},
		{"a pid /proc lists with another start time (reused)", 100, 4000, false},
		{"a pid /proc does not list", 101, 0, false},
	} {
		if got := running(tc.pid, tc.start); got != tc.want {
			t.Errorf("%s: Running(%d, %d) = %v, want %v", tc.name, tc.pid, tc.start, got, tc.want)
		}
	}
	if in, ok := (Trackers{first, second}).Lookup(12); !ok || in.PID != 12 {
		t.Errorf("Lookup(12) = %+v, %v; want the second tracker's answer", in, ok)
	}
	if _, ok := (Trackers{first, second}).Lookup(13); ok {
		t.Error("Lookup(13) named a pid no tracker knows")
	}
}
