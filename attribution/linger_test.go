package attribution

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
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
		if err := allocstatstest.Report(store, id, "pytorch", []allocstats.DeviceReport{r}, now); err != nil {
			t.Fatal(err)
		}
	}
	resolver := fakeResolver{30: {StartTime: 500, Comm: "python3", Namespace: "ml", Pod: "train-0", Container: "trainer"}}
	snap := &switchedSnapshot{listing(30)}
	src := Sources{NVML: snap, Allocator: store, Workload: resolver, SettleLabels: true, Memory: NewMemory()}
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
	if _, err := allocstatstest.OOM(store, id, allocstats.OOMMessage{UUID: g0, RequestedBytes: 2 * GiB}, now); err != nil {
		t.Fatal(err)
	}
	// It exits: NVML, the workload cache and /proc forget it at once.
	store.Prune(now, func(uint32, uint64) bool { return false })
	delete(resolver, 30)
	snap.s = joinSnapshot()

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
	if err := allocstatstest.Report(store, id, "", []allocstats.DeviceReport{{UUID: gpuUUID(0), Reserved: GiB}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	allocstatstest.Exit(store, 30, time.Now())
	if ps := store.Processes(); len(ps) != 0 {
		t.Errorf("processes after the exit without a linger: %+v", ps)
	}
}

// listing is joinSnapshot with NVML listing pids on GPU 0 too.
func listing(pids ...uint32) *nvmlpoll.Snapshot {
	s := joinSnapshot()
	for _, pid := range pids {
		s.Devices[0].Processes = append(s.Devices[0].Processes, nvmlpoll.Process{PID: pid, HasUsed: true, UsedBytes: 2 * GiB})
	}
	return s
}

// switchedSnapshot is a snapshot source a test changes between reads.
type switchedSnapshot struct{ s *nvmlpoll.Snapshot }

func (f *switchedSnapshot) Snapshot() *nvmlpoll.Snapshot { return f.s }

// A process NVML never listed (a flood of short ones, or one NVML cannot
// see) leaves no row when it exits.
func TestAnExitedProcessNVMLNeverListedLeavesNoRow(t *testing.T) {
	t.Parallel()
	store := allocstats.NewStore(time.Hour)
	store.SetLinger(time.Minute)
	now := time.Unix(1_700_000_000, 0)
	id := allocstats.Identity{PID: 30, StartTime: 500}
	r := allocstats.DeviceReport{UUID: gpuUUID(0), Reserved: GiB, OOMs: allocstats.Some(1)}
	if err := allocstatstest.Report(store, id, "pytorch", []allocstats.DeviceReport{r}, now); err != nil {
		t.Fatal(err)
	}
	src := Sources{NVML: fixedSnapshot{joinSnapshot()}, Allocator: store, Workload: fakeResolver{30: {StartTime: 500, Comm: "python3"}}, SettleLabels: true, Memory: NewMemory()}
	if rows := rowsOf(src.Read().Rows, 30); len(rows) != 1 {
		t.Fatalf("rows of the running, unlisted process = %d, want 1 (its allocator state is exported while it runs)", len(rows))
	}
	allocstatstest.Exit(store, 30, time.Now())
	if rows := rowsOf(src.Read().Rows, 30); len(rows) != 0 {
		t.Errorf("rows of the exited process NVML never listed = %+v, want none", rows)
	}
}

func rowsOf(rows []Row, pid uint32) []Row {
	var out []Row
	for _, r := range rows {
		if r.PID == pid {
			out = append(out, r)
		}
	}
	return out
}

// A new process given the pid of one that lingers (another user's) takes
// neither its counters nor its labels: the lingering row keeps its OOMs,
// uid and comm for the linger, and the new process's NVML series stand
// beside it; its allocator series follow once the linger has passed.
func TestANewHolderOfThePidNeitherResetsNorTakesOverALingeringRow(t *testing.T) {
	t.Parallel()
	const linger = time.Minute
	g0 := gpuUUID(0)
	store := allocstats.NewStore(time.Hour)
	store.SetLinger(linger)
	now := time.Unix(1_700_000_000, 0)
	feed := func(start, ooms uint64) {
		t.Helper()
		r := allocstats.DeviceReport{UUID: g0, Reserved: GiB, OOMs: allocstats.Some(ooms)}
		if err := allocstatstest.Report(store, allocstats.Identity{PID: 30, StartTime: start}, "pytorch", []allocstats.DeviceReport{r}, now); err != nil {
			t.Fatal(err)
		}
	}
	resolver := fakeResolver{30: {StartTime: 500, Comm: "python3", UID: "65534"}}
	src := Sources{NVML: fixedSnapshot{listing(30)}, Allocator: store, Workload: resolver, SettleLabels: true, Memory: NewMemory()}
	feed(500, 3)
	src.Read()
	store.Prune(now, func(uint32, uint64) bool { return false })
	resolver[30] = workload.Info{StartTime: 900, Comm: "python3", UID: "1000"}
	feed(900, 0)

	for _, at := range []time.Duration{0, linger - time.Second} {
		store.Prune(now.Add(at), nil)
		var lingering, live *Row
		for _, r := range rowsOf(src.Read().Rows, 30) {
			if r.Exited {
				lingering = &r
			} else {
				live = &r
			}
		}
		switch {
		case lingering == nil:
			t.Fatalf("%v after the exit: the lingering row is gone", at)
		case lingering.Info.UID != "65534" || lingering.Alloc.OOMs != allocstats.Some(3):
			t.Errorf("%v after the exit: lingering row uid %q, OOMs %+v; want uid 65534 and its 3 OOMs", at, lingering.Info.UID, lingering.Alloc.OOMs)
		case live == nil || live.NVML == nil || live.Info.UID != "1000":
			t.Errorf("%v after the exit: the new process's row = %+v, want its NVML listing under uid 1000", at, live)
		case live.Alloc != nil:
			t.Errorf("%v after the exit: the new process's allocator state %+v is exported beside the lingering one's", at, *live.Alloc)
		}
	}
	store.Prune(now.Add(linger), nil)
	rows := rowsOf(src.Read().Rows, 30)
	if len(rows) != 1 || rows[0].Exited || rows[0].Alloc == nil || rows[0].Alloc.OOMs != allocstats.Some(0) || rows[0].Info.UID != "1000" {
		t.Errorf("after the linger: rows of pid 30 = %+v, want the new process's only, with its allocator state", rows)
	}
}

// When the new holder of the pid carries the same labels as the lingering
// process, the two share one row: its NVML series and the lingering
// counters, so that no two series have the same labels.
func TestALingeringRowAndANewHolderWithTheSameLabelsShareOneRow(t *testing.T) {
	t.Parallel()
	store := allocstats.NewStore(time.Hour)
	store.SetLinger(time.Minute)
	now := time.Unix(1_700_000_000, 0)
	feed := func(start, ooms uint64) {
		t.Helper()
		r := allocstats.DeviceReport{UUID: gpuUUID(0), Reserved: GiB, OOMs: allocstats.Some(ooms)}
		if err := allocstatstest.Report(store, allocstats.Identity{PID: 30, StartTime: start}, "", []allocstats.DeviceReport{r}, now); err != nil {
			t.Fatal(err)
		}
	}
	resolver := fakeResolver{30: {StartTime: 500, Comm: "python3", UID: "1000"}}
	src := Sources{NVML: fixedSnapshot{listing(30)}, Allocator: store, Workload: resolver, SettleLabels: true, Memory: NewMemory()}
	feed(500, 3)
	src.Read()
	allocstatstest.Exit(store, 30, time.Now())
	resolver[30] = workload.Info{StartTime: 900, Comm: "python3", UID: "1000"}
	feed(900, 0)
	rows := rowsOf(src.Read().Rows, 30)
	if len(rows) != 1 || !rows[0].Exited || rows[0].NVML == nil || rows[0].Alloc.OOMs != allocstats.Some(3) {
		t.Errorf("rows of pid 30 = %+v, want one: the lingering counters (3 OOMs) with the new process's NVML listing", rows)
	}
}

// Of two processes of one pid that exited within the linger, the first to
// exit keeps the row; the second shows once the first's linger has passed.
func TestTheFirstOfTwoExitedHoldersOfAPidKeepsTheRow(t *testing.T) {
	t.Parallel()
	store := allocstats.NewStore(time.Hour)
	store.SetLinger(time.Minute)
	now := time.Unix(1_700_000_000, 0)
	resolver := fakeResolver{}
	src := Sources{NVML: fixedSnapshot{listing(30)}, Allocator: store, Workload: resolver, SettleLabels: true, Memory: NewMemory()}
	for i, start := range []uint64{500, 900} {
		resolver[30] = workload.Info{StartTime: start, Comm: "python3", UID: fmt.Sprint(start)}
		r := allocstats.DeviceReport{UUID: gpuUUID(0), Reserved: GiB, OOMs: allocstats.Some(start)}
		if err := allocstatstest.Report(store, allocstats.Identity{PID: 30, StartTime: start}, "", []allocstats.DeviceReport{r}, now.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
		src.Read()
		allocstatstest.Exit(store, 30, time.Now())
	}
	delete(resolver, 30)
	rows := rowsOf(src.Read().Rows, 30)
	if len(rows) != 1 || rows[0].Info.UID != "500" || rows[0].Alloc.OOMs != allocstats.Some(500) {
		t.Errorf("rows of pid 30 = %+v, want the first exited holder's only", rows)
	}
}
