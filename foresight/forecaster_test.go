package foresight

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

const (
	mib  = 1 << 20
	gib  = 1 << 30
	uuid = "GPU-00000000-0000-0000-0000-000000000001"
)

// clients records what the forecaster sends.
type clients struct {
	warnBefore allocstats.Optional
	lines      [][]byte
}

func (c *clients) Process(pid uint32) (allocstats.Process, bool) {
	return allocstats.Process{PID: pid, StartTime: 7, WarnBefore: c.warnBefore}, true
}

func (c *clients) Send(_ uint32, _ uint64, line []byte) int {
	c.lines = append(c.lines, line)
	return 1
}

// run feeds the forecaster a process whose active memory is f(t) once a
// second for d, under a limit, polling every second, and returns the
// warnings it sent with the second each came at.
func run(t *testing.T, cl *clients, d time.Duration, limit uint64, f func(s int) uint64) (*Forecaster, []sent) {
	return runOOMs(t, cl, d, limit, f, func(int) uint64 { return 0 })
}

// runOOMs is run of a process whose OOM counter is ooms(s).
func runOOMs(t *testing.T, cl *clients, d time.Duration, limit uint64, f, ooms func(s int) uint64) (*Forecaster, []sent) {
	t.Helper()
	fc := New(Config{Clients: cl})
	fc.deliver = fc.send // synchronous: the test reads what went out
	store := allocstats.NewStore(time.Hour)
	snap := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{{UUID: uuid, HasMemory: true, Memory: nvmlpoll.Memory{Total: 140 * gib, Free: 100 * gib}}}}
	join := attribution.Sources{NVML: fixedSnapshot{snap}, Allocator: store}
	t0 := time.Unix(1_800_000_000, 0)
	var out []sent
	for s := 0; s < int(d.Seconds()); s++ {
		at := t0.Add(time.Duration(s) * time.Second)
		active := f(s)
		fc.ObserveSample(100, 7, uuid, at, active)
		report := allocstats.DeviceReport{UUID: uuid, Reserved: active, Active: allocstats.Some(active), Limit: allocstats.Some(limit), OOMs: allocstats.Some(ooms(s)), At: at}
		if err := allocstatstest.Report(store, allocstats.Identity{PID: 100, UID: 1000, StartTime: 7}, "", []allocstats.DeviceReport{report}, at); err != nil {
			t.Fatal(err)
		}
		n := len(cl.lines)
		fc.ObserveView(join.Read())
		for _, l := range cl.lines[n:] {
			var w map[string]any
			if err := json.Unmarshal(l, &w); err != nil {
				t.Fatalf("warning %q: %v", l, err)
			}
			out = append(out, sent{s, w})
		}
	}
	return fc, out
}

type sent struct {
	at  int
	msg map[string]any
}

// fixedSnapshot is an NVML source that always reads the same snapshot.
type fixedSnapshot struct{ s *nvmlpoll.Snapshot }

func (f fixedSnapshot) Snapshot() *nvmlpoll.Snapshot { return f.s }

func TestALeakIsWarnedOnceWithAnEstimateNearTheTruth(t *testing.T) {
	cl := &clients{}
	// 80 MiB a second from 64 MiB under a 9 GiB limit: out of memory
	// after 114 s.
	leak := func(s int) uint64 { return 64*mib + uint64(s)*80*mib }
	_, got := run(t, cl, 100*time.Second, 9*gib, leak)
	if len(got) == 0 {
		t.Fatal("no warning in 100 s of a leak that runs out at 114 s")
	}
	first := got[0]
	truth := (9*gib - float64(leak(first.at))) / (80 * mib)
	eta := first.msg["eta_seconds"].(float64)
	if math.Abs(eta-truth) > 0.3*truth {
		t.Errorf("warned at %d s with eta_seconds %.0f, truth %.0f: want within 30%%", first.at, eta, truth)
	}
	if first.at > 45 {
		t.Errorf("first warning at %d s, want within 45 s of the leak's start", first.at)
	}
	for _, k := range []string{"gpu", "uuid", "climb_bytes_per_minute", "ceiling_bytes", "cause", "summary", "remedy"} {
		if _, ok := first.msg[k]; !ok {
			t.Errorf("warning %v lacks %s", first.msg, k)
		}
	}
	if first.msg["type"] != "warning" || first.msg["cause"] != "leak" || first.msg["ceiling"] != "limit" {
		t.Errorf("warning %v: want type warning, cause leak, ceiling limit", first.msg)
	}
	for i := 1; i < len(got); i++ {
		if got[i].at-got[i-1].at < int(MinWarnInterval.Seconds()) {
			t.Errorf("warnings at %d s and %d s: want at most one a minute", got[i-1].at, got[i].at)
		}
	}
}

func TestFlatOrSawtoothMemoryIsNeverWarned(t *testing.T) {
	for name, f := range map[string]func(s int) uint64{
		"flat":     func(int) uint64 { return 5 * gib },
		"sawtooth": func(s int) uint64 { return 2*gib + uint64(s%3)*gib },
	} {
		cl := &clients{}
		fc, got := run(t, cl, 2*time.Minute, 9*gib, f)
		if len(got) > 0 {
			t.Errorf("%s: warned %v", name, got[0].msg)
		}
		if _, ok := fc.TimeToOOM(100, 7, uuid); ok {
			t.Errorf("%s: a time to OOM is exported without a climb", name)
		}
	}
}

func TestAThresholdOfZeroInTheHelloSendsNoWarning(t *testing.T) {
	cl := &clients{warnBefore: allocstats.Some(0)}
	fc, got := run(t, cl, 100*time.Second, 9*gib, func(s int) uint64 { return 64*mib + uint64(s)*80*mib })
	if len(got) > 0 {
		t.Errorf("warned %v, want none: the client asked for none", got[0].msg)
	}
	if _, ok := fc.TimeToOOM(100, 7, uuid); !ok {
		t.Error("the time to OOM is exported whether or not the process is warned")
	}
}

// A process that raised an OOM is not warned in the minute after it (it
// dies of it, or its verdict is on its way); one that caught it and climbs
// on is warned again after that.
func TestNoWarningInTheMinuteAfterAnOOM(t *testing.T) {
	cl := &clients{}
	leak := func(s int) uint64 { return 64*mib + uint64(s)*40*mib }
	_, got := runOOMs(t, cl, 4*time.Minute, 20*gib, leak, func(s int) uint64 {
		if s >= 90 {
			return 1
		}
		return 0
	})
	var after []int
	for _, w := range got {
		if w.at >= 90 {
			after = append(after, w.at)
		}
	}
	if len(after) == 0 || after[0] < 150 {
		t.Errorf("warnings after the OOM at 90 s came at %v s, want the first a minute after it", after)
	}
}
