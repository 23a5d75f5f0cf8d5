package simulate

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// clock is a fake time that advances by step at each call.
func clock(step time.Duration) func() time.Time {
	t := time.Unix(1_750_000_000, 0)
	return func() time.Time { t = t.Add(step); return t }
}

func mustNew(t testing.TB, cfg Config) *Node {
	t.Helper()
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newPoller(n *Node) *nvmlpoll.Poller {
	return nvmlpoll.NewPoller(nvmlpoll.Config{Lib: n.Advancing()})
}

func pollOnce(t *testing.T, p *nvmlpoll.Poller) *nvmlpoll.Snapshot {
	t.Helper()
	if err := p.Poll(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	return p.Snapshot()
}

func TestSimulatedNodeInvariantsHoldAtEveryStep(t *testing.T) {
	for _, tc := range []struct {
		scenario        string
		unattributedGPU int
		steps           int
	}{
		{Load, 3, 300},
		{"mix", 7, 720}, // an hour at 5 s a step
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			checkInvariants(t, tc.scenario, tc.unattributedGPU, tc.steps)
		})
	}
}

func checkInvariants(t *testing.T, scenarioName string, unattributedGPU, steps int) {
	seq := &sequence{}
	sim := mustNew(t, Config{Scenario: scenarioName, ProcessesPerGPU: 3, Seed: 7, Open: seq.open, Now: clock(5 * time.Second)})
	p := newPoller(sim)
	var sawUnattributed, sawPeakAbove, sawExit, sawOOM, sawInactive bool
	for i := 0; i < steps; i++ {
		seq.events = nil
		snap := pollOnce(t, p)
		if len(snap.Devices) != 8 {
			t.Fatalf("step %d: %d devices", i, len(snap.Devices))
		}
		if n := len(snap.PIDs()); n > sim.MaxProcesses() {
			t.Fatalf("step %d: %d processes, above the node's most of %d", i, n, sim.MaxProcesses())
		}
		for _, d := range snap.Devices {
			m := d.Memory
			if m.Total != m.Free+m.Used+m.Reserved {
				t.Fatalf("step %d GPU %d: total %d != free %d + used %d + reserved %d", i, d.Index, m.Total, m.Free, m.Used, m.Reserved)
			}
			if d.ProcessUsedSum() > m.Used {
				t.Fatalf("step %d GPU %d: processes use more than the GPU", i, d.Index)
			}
			if d.Unattributed() > 0 {
				if d.Index != unattributedGPU {
					t.Fatalf("step %d: unattributed memory on GPU %d", i, d.Index)
				}
				sawUnattributed = true
			}
			for _, pr := range d.Processes {
				if pr.PeakBytes < pr.UsedBytes {
					t.Fatalf("peak below used: %+v", pr)
				}
				if pr.PeakBytes > pr.UsedBytes {
					sawPeakAbove = true
				}
				if pr.UsedBytes < ContextBytes {
					t.Fatalf("process below the context baseline: %+v", pr)
				}
			}
		}
		for _, e := range seq.events {
			sawExit = sawExit || e.kind == "exit"
			sawOOM = sawOOM || e.kind == "oom"
			if e.kind != "stats" {
				continue
			}
			a := e.report
			if a.Active.V > a.Reserved || a.Allocated.V > a.Active.V || a.PeakReserved.V < a.Reserved || a.PeakActive.V < a.Active.V {
				t.Fatalf("step %d: inconsistent allocator state %+v", i, a)
			}
			if a.Reserved > a.Active.V {
				sawInactive = true
			}
		}
	}
	for what, saw := range map[string]bool{"unattributed memory": sawUnattributed, "a peak above used": sawPeakAbove,
		"a process exit": sawExit, "an OOM": sawOOM, "inactive memory": sawInactive} {
		if !saw {
			t.Errorf("%d steps never showed %s", steps, what)
		}
	}
}

func TestSimulatedNodeIsDeterministicForASeed(t *testing.T) {
	run := func(seed int64) []uint64 {
		p := newPoller(mustNew(t, Config{Seed: seed, Now: clock(5 * time.Second)}))
		var used []uint64
		for i := 0; i < 50; i++ {
			snap := pollOnce(t, p)
			for _, d := range snap.Devices {
				used = append(used, d.Memory.Used)
			}
		}
		return used
	}
	a, b, c := run(3), run(3), run(4)
	same := func(x, y []uint64) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Error("the same seed gave two different runs")
	}
	if same(a, c) {
		t.Error("different seeds gave the same run")
	}
}

func TestSimulatedUUIDsArePinned(t *testing.T) {
	snap := pollOnce(t, newPoller(mustNew(t, Config{})))
	for i, d := range snap.Devices {
		if d.UUID != UUIDs[i] {
			t.Errorf("GPU %d UUID = %s, want %s", i, d.UUID, UUIDs[i])
		}
	}
}

func TestAliveKnowsOnlyTheNodesPids(t *testing.T) {
	sim := mustNew(t, Config{Scenario: Load, ProcessesPerGPU: 1})
	p := newPoller(sim)
	snap := pollOnce(t, p)
	pids := snap.PIDs()
	if len(pids) == 0 {
		t.Fatal("no process after the first step")
	}
	if alive, ok := sim.Alive(pids[0], 0); !alive || !ok {
		t.Errorf("Alive(%d) = %v, %v for a listed process; want true, true", pids[0], alive, ok)
	}
	if _, ok := sim.Alive(1, 0); ok {
		t.Error("Alive(1) claims a real pid as the node's")
	}
	if alive, ok := sim.Alive(pidBase+9999, 0); alive || !ok {
		t.Errorf("Alive of a node pid that never ran = %v, %v; want false, true", alive, ok)
	}
}

func TestUnknownScenarioIsAnError(t *testing.T) {
	if _, err := New(Config{Scenario: "nope"}); err == nil {
		t.Error("New accepted an unknown scenario")
	}
}

// The mix names its processes as Kubernetes and Slurm would: alerts group
// by pod, and the multi-rank job is one pod over two GPUs.
func TestMixNamesPodsAndSlurmJobs(t *testing.T) {
	sim := mustNew(t, Config{Seed: 1, Now: clock(5 * time.Second)})
	snap := pollOnce(t, newPoller(sim))
	pods := map[string][]int{}
	slurm := 0
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			in, ok := sim.Lookup(p.PID)
			if !ok {
				t.Fatalf("pid %d listed by NVML is unknown to Lookup", p.PID)
			}
			if in.Pod != "" {
				pods[in.Namespace+"/"+in.Pod] = append(pods[in.Namespace+"/"+in.Pod], d.Index)
			}
			if in.SlurmJobID != "" {
				slurm++
			}
			if in.StartTime == 0 {
				t.Errorf("pid %d has no start time", p.PID)
			}
		}
	}
	if g := pods["ml/ddp-train-0"]; len(g) != 2 {
		t.Errorf("ml/ddp-train-0 runs on GPUs %v, want two", g)
	}
	if slurm == 0 {
		t.Error("no Slurm job in the mix")
	}
}

// sessionEvent is one message the node's sessions sent: a hello, a stats
// report, an oom message, or an exit (the session's end).
type sessionEvent struct {
	kind   string
	id     allocstats.Identity
	report allocstats.DeviceReport
	oom    allocstats.OOMMessage
}

// sequence keeps every message of the sessions it opens (Config.Open), in
// order.
type sequence struct{ events []sessionEvent }

func (s *sequence) open(id allocstats.Identity) Session { return recordedSession{s, id} }

type recordedSession struct {
	seq *sequence
	id  allocstats.Identity
}

func (r recordedSession) add(e sessionEvent) {
	e.id = r.id
	r.seq.events = append(r.seq.events, e)
}

func (r recordedSession) Hello(allocstats.Hello) error {
	r.add(sessionEvent{kind: "hello"})
	return nil
}

func (r recordedSession) Stats(d []allocstats.DeviceReport, _ time.Time) error {
	for _, rep := range d {
		r.add(sessionEvent{kind: "stats", report: rep})
	}
	return nil
}

func (r recordedSession) OOM(m allocstats.OOMMessage, now time.Time, _ allocstats.Replier) (allocstats.OOMEvent, error) {
	r.add(sessionEvent{kind: "oom", oom: m})
	return allocstats.OOMEvent{PID: r.id.PID, UUID: m.UUID, Time: now}, nil
}

func (r recordedSession) Close(time.Time) { r.add(sessionEvent{kind: "exit"}) }

func (r recordedSession) Listen(allocstats.Replier) {}

// A Step of a minute of simulated time (Speed 60 at one poll a second)
// reports what a client pushing once a second would have: a sample of
// each process every simulated second, stamped with its own time, so
// that trends read at any Speed what they read at Speed 1.
func TestLongStepsReportEverySimulatedSecond(t *testing.T) {
	seq := &sequence{}
	sim := mustNew(t, Config{Scenario: scenario.Steady, Seed: 1, Open: seq.open, Now: clock(time.Minute)})
	sim.Step()
	first := len(seq.events)
	sim.Step()
	times := map[uint32][]time.Time{}
	for _, e := range seq.events[first:] {
		if e.kind == "stats" {
			times[e.id.PID] = append(times[e.id.PID], e.report.At)
		}
	}
	if len(times) == 0 {
		t.Fatal("no process reported in the second step")
	}
	for pid, ts := range times {
		if len(ts) != 60 {
			t.Errorf("pid %d reported %d times in a simulated minute, want 60", pid, len(ts))
			continue
		}
		for i := 1; i < len(ts); i++ {
			if d := ts[i].Sub(ts[i-1]); d != time.Second {
				t.Errorf("pid %d: samples %d and %d are %v apart, want 1s", pid, i-1, i, d)
				break
			}
		}
	}
}

// TestStatsBeforeAnOOMAreTheFiguresAtTheFailure checks that each oom
// message comes right after a stats report of the same process holding the
// allocator's figures at the failure, as a client reads them in PyTorch's
// OOM observer, and that what a process reports never goes back in time:
// its counters and peaks never fall, and it reports nothing after its exit.
func TestStatsBeforeAnOOMAreTheFiguresAtTheFailure(t *testing.T) {
	for _, step := range []time.Duration{time.Second, 5 * time.Minute} {
		t.Run(step.String(), func(t *testing.T) {
			const seed = 3
			seq := &sequence{}
			sim := mustNew(t, Config{Seed: seed, Open: seq.open, Now: clock(step)})
			// The same scenario, advanced alike, says what each OOM's
			// figures were.
			ref, err := scenario.New(scenario.Mix, seed)
			if err != nil {
				t.Fatal(err)
			}
			var want []scenario.OOM
			for at := time.Duration(0); at <= 2*time.Hour; at += step {
				sim.Step()
				dt := step
				if at == 0 {
					dt = 0 // the first Step starts the node
				}
				want = append(want, ref.Advance(dt).OOMs...)
			}
			var ooms int
			type reported struct {
				ooms, retries, peakActive, peakReserved uint64
				exited                                  bool
			}
			last := map[uint32]reported{}
			for i, e := range seq.events {
				switch e.kind {
				case "stats":
					l := last[e.id.PID]
					r := e.report
					if l.exited {
						t.Fatalf("pid %d reported after its exit", e.id.PID)
					}
					if r.OOMs.V < l.ooms || r.AllocRetries.V < l.retries || r.PeakActive.V < l.peakActive || r.PeakReserved.V < l.peakReserved {
						t.Fatalf("pid %d's counters or peaks fell: %+v after %+v", e.id.PID, r, l)
					}
					last[e.id.PID] = reported{r.OOMs.V, r.AllocRetries.V, r.PeakActive.V, r.PeakReserved.V, false}
				case "exit":
					l := last[e.id.PID]
					l.exited = true
					last[e.id.PID] = l
				case "oom":
					if ooms >= len(want) {
						t.Fatalf("more oom messages than the scenario's %d OOMs", len(want))
					}
					o := want[ooms]
					ooms++
					if e.id.PID != uint32(pidBase+o.PID) || e.oom.RequestedBytes != o.Requested || e.oom.FreeBytes.V != o.Free || e.oom.LimitBytes.V != o.Limit {
						t.Fatalf("oom message %d is %+v of pid %d, want the OOM of pid %d at %v: %+v", ooms, e.oom, e.id.PID, pidBase+o.PID, o.At, o)
					}
					if i == 0 || seq.events[i-1].kind != "stats" || seq.events[i-1].id.PID != e.id.PID {
						t.Fatalf("the OOM of pid %d at %v does not follow a stats report of that process", e.id.PID, o.At)
					}
					r, a := seq.events[i-1].report, o.AtFailure
					if r.Reserved != a.Reserved || r.Active.V != a.Active || r.InactiveSplit.V != a.InactiveSplit ||
						r.Allocated.V != a.Allocated || r.OOMs.V != a.OOMs || r.AllocRetries.V != a.AllocRetries {
						t.Errorf("stats before the OOM of pid %d at %v: reserved %d, active %d, inactive_split %d, ooms %d; want the figures at the failure: %d, %d, %d, %d",
							e.id.PID, o.At, r.Reserved, r.Active.V, r.InactiveSplit.V, r.OOMs.V, a.Reserved, a.Active, a.InactiveSplit, a.OOMs)
					}
				}
			}
			if ooms != len(want) || ooms < 20 {
				t.Errorf("%d oom messages for the scenario's %d OOMs in 2 hours, want them all and 20 or more", ooms, len(want))
			}
		})
	}
}

// A poll of Advancing steps the node; a poll of Interface reads the last
// step and never moves it.
func TestOnlyTheAdvancingNVMLStepsTheNode(t *testing.T) {
	sim := mustNew(t, Config{Scenario: Load, ProcessesPerGPU: 1, Now: clock(time.Minute)})
	still := nvmlpoll.NewPoller(nvmlpoll.Config{Lib: sim.Interface()})
	if snap := pollOnce(t, still); len(snap.PIDs()) != 0 {
		t.Fatalf("a poll of Interface before any step lists %v", snap.PIDs())
	}
	snap := pollOnce(t, newPoller(sim))
	if len(snap.PIDs()) == 0 {
		t.Fatal("a poll of Advancing did not start the node")
	}
	for i := 0; i < 3; i++ {
		if got := pollOnce(t, still); !slices.Equal(got.PIDs(), snap.PIDs()) || got.Devices[0].Memory != snap.Devices[0].Memory {
			t.Fatal("a poll of Interface moved the node")
		}
	}
}

// The node's processes report to the store as any client does, through
// sessions, under the per-uid cap of the flags' defaults and a process
// cap raised by the node's size, as main sets them: in the load scenario,
// at 16 processes per GPU (twice the per-uid cap) and at 99 (the most),
// every live process that reports is in the store at every step,
// connected, and a process that exited lingers, no longer connected.
func TestTheLoadScenarioReportsWithinTheStoresCaps(t *testing.T) {
	for _, perGPU := range []int{16, 99} {
		t.Run(fmt.Sprint(perGPU), func(t *testing.T) { checkReportsWithinCaps(t, perGPU, 600) })
	}
}

func checkReportsWithinCaps(t *testing.T, perGPU, steps int) {
	store := allocstats.NewStore(allocstats.DefaultTTL)
	store.SetLinger(allocstats.DefaultOOMLinger)
	now := time.Unix(1_750_000_000, 0)
	sim := mustNew(t, Config{Scenario: Load, ProcessesPerGPU: perGPU, Seed: 1, Open: Sessions(store),
		Now: func() time.Time { now = now.Add(time.Second); return now }})
	if sim.MaxProcesses() != 8*perGPU {
		t.Fatalf("MaxProcesses = %d, want %d", sim.MaxProcesses(), 8*perGPU)
	}
	store.SetProcessLimits(allocstats.DefaultMaxProcesses+sim.MaxProcesses(), allocstats.DefaultMaxProcessesPerUID)
	p := newPoller(sim)
	p.OnPoll(func(*nvmlpoll.Snapshot) {
		store.Prune(now, func(pid uint32, start uint64) bool { alive, _ := sim.Alive(pid, start); return alive })
	})
	sawExited := false
	for step := 1; step <= steps; step++ {
		pollOnce(t, p)
		want := map[uint32]bool{}
		sim.mu.Lock()
		for _, pr := range sim.state.processes {
			if pr.report != nil {
				want[uint32(pr.pid)] = true
			}
		}
		sim.mu.Unlock()
		got := map[uint32]bool{}
		for _, pr := range store.Processes() {
			switch {
			case pr.Exited && (pr.Connected || want[pr.PID]):
				t.Fatalf("step %d: pid %d is among the exited processes, connected %v, live %v", step, pr.PID, pr.Connected, want[pr.PID])
			case pr.Exited:
				sawExited = true
			case !pr.Connected:
				t.Fatalf("step %d: live pid %d is not connected", step, pr.PID)
			default:
				got[pr.PID] = true
			}
		}
		if len(got) != len(want) {
			t.Fatalf("step %d: the store holds %d live processes, the node runs %d that report", step, len(got), len(want))
		}
		for pid := range want {
			if !got[pid] {
				t.Fatalf("step %d: reporting pid %d is not in the store", step, pid)
			}
		}
	}
	if !sawExited {
		t.Errorf("no exited process lingered in %d steps", steps)
	}
}

// Each process reports under a start time (never 0) and a uid of its own;
// the load scenario's processes under their slot's.
func TestEachProcessReportsUnderAUidOfItsOwn(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		perUID   func(id allocstats.Identity) uint32
	}{
		{Load, func(id allocstats.Identity) uint32 { return (id.PID - pidBase) / 100 }}, // the slot
		{scenario.Mix, func(id allocstats.Identity) uint32 { return id.PID }},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			seq := &sequence{}
			sim := mustNew(t, Config{Scenario: tc.scenario, ProcessesPerGPU: 16, Seed: 1, Open: seq.open, Now: clock(5 * time.Second)})
			for i := 0; i < 200; i++ {
				sim.Step()
			}
			owner, uid := map[uint32]uint32{}, map[uint32]uint32{}
			for _, e := range seq.events {
				if e.id.StartTime == 0 {
					t.Fatalf("pid %d reports without a start time", e.id.PID)
				}
				key := tc.perUID(e.id)
				if o, ok := owner[e.id.UID]; ok && o != key {
					t.Fatalf("uid %d reports for two owners, %d and %d", e.id.UID, o, key)
				}
				if u, ok := uid[key]; ok && u != e.id.UID {
					t.Fatalf("owner %d reports under two uids, %d and %d", key, u, e.id.UID)
				}
				owner[e.id.UID], uid[key] = key, e.id.UID
			}
			if len(owner) < 2 {
				t.Errorf("%d uids in 200 steps", len(owner))
			}
		})
	}
}
