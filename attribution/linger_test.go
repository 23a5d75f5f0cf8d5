package attribution

import (
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/workload"
)

// A process that raises an OOM and exits keeps its counters, last OOM and
// labels for the linger, without its memory, then goes.
func TestExitedProcessLingersWithItsCountersAndLabels(t *testing.T) {
	t.Parallel()
	const linger = time.Minute
	g0 := gpuUUID(0)
	store := allocstats.NewStore(time.Hour)
	store.SetLinger(linger)
	id := allocstats.Identity{PID: 30, StartTime: 500}
	now := time.Unix(1_700_000_000, 0)
	report := func(ooms uint64) {
		t.Helper()
		r := allocstats.DeviceReport{UUID: g0, Reserved: 8 * GiB, Active: allocstats.Some(6 * GiB),
			PeakActive: allocstats.Some(7 * GiB), OOMs: allocstats.Some(ooms), AllocRetries: allocstats.Some(ooms)}
		if err := store.Feed(id, "pytorch", []allocstats.DeviceReport{r}, now); err != nil {
			t.Fatal(err)
		}
	}
	resolver := fakeResolver{30: {StartTime: 500, Comm: "python3", Namespace: "ml", Pod: "train-0", Container: "trainer"}}
	src := Sources{NVML: fixedSnapshot{joinSnapshot()}, Allocator: store, Workload: resolver, SettleLabels: true, Memory: NewMemory()}
	row := func() *Row {
		for _, r := range src.Read().Rows {
			if r.PID == 30 {
				return &r
			}
		}
		return nil
	}

	report(0)
	running := row()
	if running == nil || running.Exited || running.Alloc.Reserved != 8*GiB {
		t.Fatalf("running process's row = %+v, want its allocator state", running)
	}
	report(1) // the OOM, in its last report
	if _, err := store.FeedOOM(id, allocstats.OOMMessage{UUID: g0, RequestedBytes: 2 * GiB}, now); err != nil {
		t.Fatal(err)
	}
	// It exits: the workload cache and /proc forget it at once.
	store.Prune(now, func(uint32, uint64) bool { return false })
	delete(resolver, 30)

	for _, at := range []time.Duration{0, linger / 2, linger - time.Second} {
		store.Prune(now.Add(at), nil)
		r := row()
		switch {
		case r == nil:
			t.Fatalf("%v after the exit: the process's row is gone, want it kept for the %v linger", at, linger)
		case !r.Exited:
			t.Errorf("%v after the exit: row not marked exited", at)
		case r.Info != running.Info || r.Comm != running.Comm || r.Framework != running.Framework:
			t.Errorf("%v after the exit: labels %+v %q %q, want those it ran with %+v %q %q", at, r.Info, r.Comm, r.Framework, running.Info, running.Comm, running.Framework)
		case r.Alloc.OOMs != allocstats.Some(1) || r.Alloc.AllocRetries != allocstats.Some(1) || r.Alloc.LastOOMRequest != allocstats.Some(2*GiB):
			t.Errorf("%v after the exit: counters %+v, want 1 OOM, 1 retry, a last request of 2 GiB", at, *r.Alloc)
		case r.Alloc.Reserved != 0 || r.Alloc.Active.OK || r.Alloc.PeakActive.OK || r.Alloc.ActiveFloor.OK:
			t.Errorf("%v after the exit: memory %+v kept, want none (the process holds nothing)", at, *r.Alloc)
		}
		if _, ok := r.Context(); ok {
			t.Errorf("%v after the exit: a context for a process that exited", at)
		}
	}
	store.Prune(now.Add(linger), nil)
	if r := row(); r != nil {
		t.Errorf("after the linger: row %+v, want none", *r)
	}
}

func TestExitedProcessGoesAtOnceWithoutLinger(t *testing.T) {
	t.Parallel()
	store := allocstats.NewStore(time.Hour)
	id := allocstats.Identity{PID: 30, StartTime: 500}
	if err := store.Feed(id, "", []allocstats.DeviceReport{{UUID: gpuUUID(0), Reserved: GiB}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	store.Remove(30)
	if ps := store.Processes(); len(ps) != 0 {
		t.Errorf("processes after Remove without a linger: %+v", ps)
	}
}

// A new process with the pid of one that lingers gets its own row; the
// lingering one, which a join never saw run under these labels, is not
// exported with the new process's labels.
func TestLingeringProcessNeverTakesANewProcesssLabels(t *testing.T) {
	t.Parallel()
	g0 := gpuUUID(0)
	store := allocstats.NewStore(time.Hour)
	store.SetLinger(time.Minute)
	now := time.Unix(1_700_000_000, 0)
	feed := func(start uint64) {
		t.Helper()
		if err := store.Feed(allocstats.Identity{PID: 30, StartTime: start}, "", []allocstats.DeviceReport{{UUID: g0, Reserved: GiB, OOMs: allocstats.Some(start)}}, now); err != nil {
			t.Fatal(err)
		}
	}
	resolver := fakeResolver{30: {StartTime: 500, Comm: "old"}}
	src := Sources{NVML: fixedSnapshot{joinSnapshot()}, Allocator: store, Workload: resolver, SettleLabels: true, Memory: NewMemory()}
	feed(500)
	src.Read()
	store.Remove(30)
	resolver[30] = workload.Info{StartTime: 900, Comm: "new"}
	feed(900)
	var got []string
	for _, r := range src.Read().Rows {
		if r.PID == 30 {
			got = append(got, r.Comm)
			if r.Exited {
				t.Errorf("the new process's row is marked exited")
			}
		}
	}
	if len(got) != 1 || got[0] != "new" {
		t.Errorf("rows of pid 30 = %v, want the new process's only", got)
	}
}
