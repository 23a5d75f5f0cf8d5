package scenario

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// run advances a node of the scenario for d in steps of dt and calls f
// after each step.
func run(t *testing.T, scenario string, seed uint64, d, dt time.Duration, f func(Tick)) {
	t.Helper()
	runNode(t, scenario, seed, d, dt, func(_ *Node, tk Tick) { f(tk) })
}

func runNode(t *testing.T, scenario string, seed uint64, d, dt time.Duration, f func(*Node, Tick)) {
	t.Helper()
	n, err := New(scenario, seed)
	if err != nil {
		t.Fatal(err)
	}
	for n.Elapsed() < d {
		f(n, n.Advance(dt))
	}
}

// stepFloors returns the floor of the step each live process runs: what
// active comes back to between batches.
func stepFloors(n *Node) map[int]uint64 {
	f := map[int]uint64{}
	for _, j := range n.jobs {
		for _, p := range j.procs {
			f[p.PID] = p.floor
		}
	}
	return f
}

// checkInvariants reports every broken rule of the memory model in tk.
func checkInvariants(t *testing.T, scenario string, tk Tick) {
	t.Helper()
	var used [GPUs]uint64
	var procs [GPUs]int
	for _, p := range tk.Processes {
		at := func(format string, args ...any) {
			t.Helper()
			t.Errorf("%s at %v, pid %d (%s, %s) on GPU %d: "+format,
				append([]any{scenario, tk.Elapsed, p.PID, p.Job, p.Kind, p.GPU}, args...)...)
		}
		if p.GPU < 0 || p.GPU >= GPUs {
			at("GPU index out of range")
			continue
		}
		used[p.GPU] += p.Used()
		procs[p.GPU]++
		if p.Reserved%(2*MiB) != 0 {
			at("reserved %d is not a multiple of 2 MiB", p.Reserved)
		}
		if !(p.Reserved >= p.Active && p.Active >= p.Allocated) {
			at("want reserved %d >= active %d >= allocated %d", p.Reserved, p.Active, p.Allocated)
		}
		if p.InactiveSplit > p.Inactive() {
			at("inactive_split %d > inactive %d", p.InactiveSplit, p.Inactive())
		}
		if p.Reserved != p.Active+p.Inactive() || p.Used() != p.Context+p.Reserved {
			at("reserved != active + inactive or used != context + reserved")
		}
		if p.Context < CUDAContextBytes {
			at("context %d below the CUDA context's %d", p.Context, CUDAContextBytes)
		}
		if p.PeakActive < p.Active || p.PeakReserved < p.Reserved {
			at("peaks (%d active, %d reserved) below the current figures (%d, %d)", p.PeakActive, p.PeakReserved, p.Active, p.Reserved)
		}
		if p.Limit > 0 && p.Reserved > p.Limit {
			at("reserved %d above the limit %d", p.Reserved, p.Limit)
		}
		if p.OOMs > p.AllocRetries {
			at("%d OOMs but %d retries: every OOM counts a retry", p.OOMs, p.AllocRetries)
		}
	}
	if len(tk.GPUs) != GPUs {
		t.Fatalf("%s: %d GPUs, want %d", scenario, len(tk.GPUs), GPUs)
	}
	for g, gpu := range tk.GPUs {
		if gpu.Index != g || gpu.Total != TotalBytes || gpu.DriverReserved != DriverReservedBytes {
			t.Errorf("%s at %v: GPU %d has index %d, total %d, driver reserved %d", scenario, tk.Elapsed, g, gpu.Index, gpu.Total, gpu.DriverReserved)
		}
		if gpu.Used != used[g]+gpu.Unattributed {
			t.Errorf("%s at %v: GPU %d used %d, want the processes' %d + unattributed %d", scenario, tk.Elapsed, g, gpu.Used, used[g], gpu.Unattributed)
		}
		if gpu.Used > TotalBytes-DriverReservedBytes || gpu.Free != TotalBytes-DriverReservedBytes-gpu.Used {
			t.Errorf("%s at %v: GPU %d used %d, free %d: want used + free = total - driver reserved", scenario, tk.Elapsed, g, gpu.Used, gpu.Free)
		}
		if gpu.Processes != procs[g] {
			t.Errorf("%s at %v: GPU %d counts %d processes, lists %d", scenario, tk.Elapsed, g, gpu.Processes, procs[g])
		}
	}
}

func TestEveryScenarioKeepsTheMemoryModel(t *testing.T) {
	t.Parallel()
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seen := map[int]Process{} // last state of every pid seen
			gone := map[int]bool{}
			// Uneven steps, so that steps land anywhere in the sawtooth.
			steps := []time.Duration{time.Second, 7 * time.Second, 15 * time.Second, 2300 * time.Millisecond}
			n, err := New(name, 7)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; n.Elapsed() < 3*time.Hour; i++ {
				tk := n.Advance(steps[i%len(steps)])
				checkInvariants(t, name, tk)
				for _, p := range tk.Processes {
					if gone[p.PID] {
						t.Fatalf("%s at %v: pid %d came back after it exited", name, tk.Elapsed, p.PID)
					}
					if last, ok := seen[p.PID]; ok {
						if p.AllocRetries < last.AllocRetries || p.OOMs < last.OOMs {
							t.Errorf("%s at %v: pid %d's counters went down", name, tk.Elapsed, p.PID)
						}
						if p.Context != last.Context || p.Started != last.Started {
							t.Errorf("%s at %v: pid %d's context or start changed", name, tk.Elapsed, p.PID)
						}
					}
					seen[p.PID] = p
				}
				for _, p := range tk.Exited {
					gone[p.PID] = true
				}
				for _, o := range tk.OOMs {
					if o.At > tk.Elapsed || o.At <= tk.Elapsed-steps[i%len(steps)] {
						t.Errorf("%s: OOM at %v reported in the step ending at %v", name, o.At, tk.Elapsed)
					}
					if o.Requested == 0 || o.Requested%(2*MiB) != 0 {
						t.Errorf("%s: OOM at %v requested %d bytes, want a positive multiple of 2 MiB", name, o.At, o.Requested)
					}
					if o.Limit == TotalBytes && o.Free >= o.Requested {
						t.Errorf("%s: OOM at %v without a limit requested %d with %d free", name, o.At, o.Requested, o.Free)
					}
					checkAtFailure(t, name, o)
				}
			}
		})
	}
}

// checkAtFailure reports every broken rule of the memory model in the
// allocator's figures at an OOM.
func checkAtFailure(t *testing.T, scenario string, o OOM) {
	t.Helper()
	a := o.AtFailure
	at := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: OOM at %v of pid %d (%s): at the failure "+format, append([]any{scenario, o.At, o.PID, o.Kind}, args...)...)
	}
	if a.PID != o.PID || a.GPU != o.GPU || a.Kind != o.Kind {
		at("pid %d, GPU %d, kind %s: not the process that failed", a.PID, a.GPU, a.Kind)
	}
	if a.Reserved%(2*MiB) != 0 {
		at("reserved %d is not a multiple of 2 MiB", a.Reserved)
	}
	if !(a.Reserved >= a.Active && a.Active >= a.Allocated) {
		at("want reserved %d >= active %d >= allocated %d", a.Reserved, a.Active, a.Allocated)
	}
	if a.InactiveSplit > a.Reserved-min(a.Active, a.Reserved) {
		at("inactive_split %d > reserved %d - active %d", a.InactiveSplit, a.Reserved, a.Active)
	}
	if a.PeakActive < a.Active || a.PeakReserved < a.Reserved {
		at("peaks (%d active, %d reserved) below the figures (%d, %d)", a.PeakActive, a.PeakReserved, a.Active, a.Reserved)
	}
	if a.Limit > 0 && a.Reserved > a.Limit {
		at("reserved %d above the limit %d", a.Reserved, a.Limit)
	}
	if a.OOMs == 0 || a.OOMs > a.AllocRetries || a.LastOOMRequest != o.Requested || a.LastOOMAt != o.At {
		at("%d OOMs, %d retries, last OOM %d at %v: the counters must count this OOM and its retry", a.OOMs, a.AllocRetries, a.LastOOMRequest, a.LastOOMAt)
	}
	if a.Context < CUDAContextBytes {
		at("context %d below the CUDA context's", a.Context)
	}
}

// seenOOM is an OOM with what else its GPU held when it was raised.
type seenOOM struct {
	OOM
	// others are the other processes on the GPU at the end of the
	// second in which the OOM was raised.
	others []Process
	// othersUsed is what the other processes held at the failure: all
	// that the GPU did not have free, less the failing process's used and
	// the unattributed memory.
	othersUsed uint64
}

// shortfall is what the request lacked of the GPU's free memory.
func (o seenOOM) shortfall() uint64 { return o.Requested - min(o.Requested, o.Free) }

func (o seenOOM) othersInactive() uint64 {
	var in uint64
	for _, p := range o.others {
		if p.ReportsAllocator {
			in += p.Inactive()
		}
	}
	return in
}

// contexts is the sum of the contexts on the GPU, the failing process's
// included.
func (o seenOOM) contexts() uint64 {
	c := o.AtFailure.Context
	for _, p := range o.others {
		c += p.Context
	}
	return c
}

func oomsSeen(t *testing.T, scenario string, seed uint64, d time.Duration) []seenOOM {
	t.Helper()
	var seen []seenOOM
	run(t, scenario, seed, d, time.Second, func(tk Tick) {
		for _, o := range tk.OOMs {
			s := seenOOM{OOM: o}
			for _, p := range tk.Processes {
				if p.GPU == o.GPU && p.PID != o.PID {
					s.others = append(s.others, p)
				}
			}
			held := usableBytes - o.Free
			s.othersUsed = held - min(held, o.AtFailure.Used()+tk.GPUs[o.GPU].Unattributed)
			seen = append(seen, s)
		}
	})
	return seen
}

// oomCauses holds, for each kind whose OOM has one cause only, what the
// figures at its OOM must show: the cause's condition, and not the
// conditions of the causes nearest to it. It returns what is wrong.
var oomCauses = map[string]func(o seenOOM) string{
	Limit: func(o seenOOM) string {
		a := o.AtFailure
		switch {
		case a.Limit == 0 || o.Limit != a.Limit:
			return fmt.Sprintf("limit %d (process %d): a limit job without its limit", o.Limit, a.Limit)
		case o.Requested+a.Reserved <= a.Limit:
			return fmt.Sprintf("requested %d + reserved %d within the limit %d", o.Requested, a.Reserved, a.Limit)
		case o.Free < o.Requested:
			return fmt.Sprintf("free %d < requested %d: the GPU should have room", o.Free, o.Requested)
		case a.InactiveSplit >= o.Requested:
			return fmt.Sprintf("inactive_split %d >= requested %d reads as fragmentation", a.InactiveSplit, o.Requested)
		case o.Caught:
			return "caught"
		case o.At-a.Started > 10*time.Minute:
			return fmt.Sprintf("OOM %v after the start, want within minutes", o.At-a.Started)
		}
		return ""
	},
	TooLarge: func(o seenOOM) string {
		switch {
		case o.Requested <= TotalBytes:
			return fmt.Sprintf("requested %d, not more than the GPU's %d", o.Requested, TotalBytes)
		case o.Caught:
			return "caught"
		case o.At-o.AtFailure.Started < 30*time.Second:
			return fmt.Sprintf("OOM %v after the start: the model loads for 30 s or more first", o.At-o.AtFailure.Started)
		}
		return ""
	},
	Neighbours: func(o seenOOM) string {
		short := o.shortfall()
		switch {
		case o.Free >= o.Requested:
			return fmt.Sprintf("free %d >= requested %d", o.Free, o.Requested)
		case o.Requested > TotalBytes || o.AtFailure.Limit > 0:
			return fmt.Sprintf("requested %d with limit %d: too large, not neighbours", o.Requested, o.AtFailure.Limit)
		case o.othersUsed < short:
			return fmt.Sprintf("the others hold %d, less than the shortfall %d", o.othersUsed, short)
		case o.othersInactive() < short/3:
			return fmt.Sprintf("the others' inactive %d is under a third of the shortfall %d", o.othersInactive(), short)
		case o.Caught:
			return "caught"
		}
		return ""
	},
	Contexts: func(o seenOOM) string {
		short := o.shortfall()
		switch {
		case o.Free >= o.Requested:
			return fmt.Sprintf("free %d >= requested %d", o.Free, o.Requested)
		case len(o.others) < 12:
			return fmt.Sprintf("%d other processes on the GPU, want 12 or more", len(o.others))
		case o.contexts() < short:
			return fmt.Sprintf("the contexts' %d do not cover the shortfall %d", o.contexts(), short)
		case o.othersInactive() > short/4:
			return fmt.Sprintf("the others' inactive %d is over a quarter of the shortfall %d: reads as neighbours", o.othersInactive(), short)
		case o.contexts() < TotalBytes/20:
			return fmt.Sprintf("the contexts' %d are not a material share of the GPU", o.contexts())
		}
		return ""
	},
	FragmentationOOM: func(o seenOOM) string {
		a := o.AtFailure
		switch {
		case !o.Caught:
			return "not caught: the program lives on"
		case a.InactiveSplit < o.Requested:
			return fmt.Sprintf("inactive_split %d < requested %d", a.InactiveSplit, o.Requested)
		case a.Limit == 0 || o.Requested+a.Reserved <= a.Limit:
			return fmt.Sprintf("requested %d + reserved %d within the limit %d", o.Requested, a.Reserved, a.Limit)
		case o.Free < o.Requested:
			return fmt.Sprintf("free %d < requested %d: the GPU should have room", o.Free, o.Requested)
		}
		return ""
	},
}

// TestOOMsShowTheirCause runs each kind of OOM alone and in the mix, and
// checks that the figures at each of its OOMs show its cause.
func TestOOMsShowTheirCause(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scenario string
		// least is how many OOMs of each kind an hour brings at least.
		least map[string]int
	}{
		{Limit, map[string]int{Limit: 16}},
		{TooLarge, map[string]int{TooLarge: 16}},
		{Neighbours, map[string]int{Neighbours: 16}},
		{Contexts, map[string]int{Contexts: 16}},
		{FragmentationOOM, map[string]int{FragmentationOOM: 16}},
		{Mix, map[string]int{Limit: 2, TooLarge: 2, Neighbours: 2, Contexts: 2, FragmentationOOM: 2}},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			t.Parallel()
			count := map[string]int{}
			for _, o := range oomsSeen(t, tc.scenario, 11, time.Hour) {
				count[o.Kind]++
				if check := oomCauses[o.Kind]; check != nil {
					if wrong := check(o); wrong != "" {
						t.Errorf("%s: %s OOM of pid %d at %v: %s", tc.scenario, o.Kind, o.PID, o.At, wrong)
					}
				}
			}
			for kind, least := range tc.least {
				if count[kind] < least {
					t.Errorf("%s: %d %s OOMs in an hour, want %d or more", tc.scenario, count[kind], kind, least)
				}
			}
		})
	}
}

// TestJobsThatCannotFitFailEveryRun checks the jobs that fail at load
// (too large, or coming after the GPU is full): each of their runs ends in
// an OOM, and they come back after their back-off.
func TestJobsThatCannotFitFailEveryRun(t *testing.T) {
	t.Parallel()
	for _, scenario := range []string{TooLarge, Neighbours, Contexts, Mix} {
		t.Run(scenario, func(t *testing.T) {
			t.Parallel()
			failing := map[*job]bool{}
			jobOf := map[int]*job{}
			oomed := map[int]bool{}
			runNode(t, scenario, 5, time.Hour, time.Second, func(n *Node, tk Tick) {
				for _, j := range n.jobs {
					if j.spec.kind == TooLarge || j.spec.startAfter > 0 {
						failing[j] = true
						for _, p := range j.procs {
							jobOf[p.PID] = j
						}
					}
				}
				for _, o := range tk.OOMs {
					oomed[o.PID] = true
				}
				for _, p := range tk.Exited {
					if j := jobOf[p.PID]; j != nil && !oomed[p.PID] {
						t.Errorf("pid %d of %s exited at %v without an OOM", p.PID, j.spec.identity.Job, tk.Elapsed)
					}
				}
			})
			if len(failing) == 0 {
				t.Fatal("no job that cannot fit")
			}
			for j := range failing {
				if j.gen < 5 {
					t.Errorf("%s ran %d times in an hour, want a crash loop", j.spec.identity.Job, j.gen)
				}
			}
		})
	}
}

func TestNewProcessesStartFromZero(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	run(t, Leak, 3, 2*time.Hour, time.Second, func(tk Tick) {
		for _, p := range tk.Processes {
			if seen[p.PID] {
				continue
			}
			seen[p.PID] = true
			if p.AllocRetries != 0 || p.OOMs != 0 || p.LastOOMRequest != 0 {
				t.Errorf("pid %d first seen at %v with %d retries, %d OOMs", p.PID, tk.Elapsed, p.AllocRetries, p.OOMs)
			}
			if age := tk.Elapsed - p.Started; age > time.Second || age < 0 {
				t.Errorf("pid %d first seen %v after it started", p.PID, age)
			}
		}
	})
	if len(seen) < 16 {
		t.Errorf("%d processes in 2 hours of leaks on 8 GPUs: they should restart after each OOM", len(seen))
	}
}

// TestSameSeedSameNode checks that a node's state depends on the seed and
// the time only, not on how the time was cut into steps.
func TestSameSeedSameNode(t *testing.T) {
	t.Parallel()
	for _, name := range []string{Mix, MultiRank, Growth} {
		fine, _ := New(name, 42)
		coarse, _ := New(name, 42)
		other, _ := New(name, 43)
		var fineOOMs, coarseOOMs []OOM
		for minute := 1; minute <= 90; minute++ {
			var f Tick
			for i := 0; i < 60; i++ {
				f = fine.Advance(time.Second)
				fineOOMs = append(fineOOMs, f.OOMs...)
				f.OOMs, f.Exited = nil, nil
			}
			c := coarse.Advance(time.Minute)
			coarseOOMs = append(coarseOOMs, c.OOMs...)
			c.OOMs, c.Exited = nil, nil
			if !reflect.DeepEqual(f, c) {
				t.Fatalf("%s: state after %d minutes differs between 1-second and 1-minute steps", name, minute)
			}
			o := other.Advance(time.Minute)
			o.OOMs, o.Exited = nil, nil
			if minute == 90 && reflect.DeepEqual(o, c) {
				t.Errorf("%s: seeds 42 and 43 give the same node", name)
			}
		}
		if !reflect.DeepEqual(fineOOMs, coarseOOMs) {
			t.Errorf("%s: OOMs differ between 1-second and 1-minute steps", name)
		}
	}
}

func TestUnknownScenario(t *testing.T) {
	t.Parallel()
	_, err := New("nope", 1)
	if err == nil || !strings.Contains(err.Error(), Mix) {
		t.Errorf("New(nope) = %v, want an error listing the scenarios", err)
	}
}

// history is what a test keeps of each process over a run.
type history struct {
	first, last Process
	samples     []Process
	times       []time.Duration
	floors      []uint64 // the running step's floor at each sample
	oom         *OOM
}

func histories(t *testing.T, scenario string, seed uint64, d, dt time.Duration) (map[int]*history, []OOM) {
	t.Helper()
	h := map[int]*history{}
	var ooms []OOM
	runNode(t, scenario, seed, d, dt, func(n *Node, tk Tick) {
		stepFloor := stepFloors(n)
		for _, p := range tk.Processes {
			ph := h[p.PID]
			if ph == nil {
				ph = &history{first: p}
				h[p.PID] = ph
			}
			ph.last = p
			ph.samples = append(ph.samples, p)
			ph.times = append(ph.times, tk.Elapsed)
			ph.floors = append(ph.floors, stepFloor[p.PID])
		}
		for _, o := range tk.OOMs {
			o := o
			ooms = append(ooms, o)
			if ph := h[o.PID]; ph != nil && ph.oom == nil {
				ph.oom = &o
			}
		}
	})
	return h, ooms
}

// floors returns the least step floor of each window of w samples, after
// the first skip samples (loading).
func floors(h *history, skip, w int) []uint64 {
	var out []uint64
	for i := skip; i+w <= len(h.floors); i += w {
		m := h.floors[i]
		for _, f := range h.floors[i : i+w] {
			m = min(m, f)
		}
		out = append(out, m)
	}
	return out
}

func TestScenariosBehaveAsNamed(t *testing.T) {
	t.Parallel()
	const dt = time.Second // fine enough to find each step's floor
	for _, tc := range []struct {
		scenario string
		check    func(t *testing.T, h map[int]*history, ooms []OOM)
	}{
		{Steady, func(t *testing.T, h map[int]*history, ooms []OOM) {
			noOOMsNoRetries(t, h, ooms)
			for pid, ph := range h {
				f := floors(ph, 120, 600) // 10-minute floors
				if lo, hi := minMax(f); float64(hi-lo) > 0.02*float64(hi) {
					t.Errorf("pid %d: the floor of active moved from %d to %d in steady training", pid, lo, hi)
				}
				if ph.last.PeakActive-ph.last.Active < ph.last.PeakActive/20 && ph.last.Active == ph.first.Active {
					t.Errorf("pid %d: active does not move with the steps", pid)
				}
			}
		}},
		{Leak, func(t *testing.T, h map[int]*history, ooms []OOM) {
			for pid, ph := range h {
				if ph.oom == nil {
					continue // still running at the end
				}
				age := ph.oom.At - ph.first.Started
				if age < 5*time.Minute || age > 40*time.Minute {
					t.Errorf("pid %d: the leak reached OOM after %v, want 5 to 40 minutes", pid, age)
				}
				f := floors(ph, 120, 120) // 2-minute floors
				for i := 1; i < len(f)-1; i++ {
					if f[i] <= f[i-1] {
						t.Errorf("pid %d: the floor of active fell or stayed (%d then %d) during a leak", pid, f[i-1], f[i])
						break
					}
				}
				if ph.oom.Caught {
					t.Errorf("pid %d: a leaking trainer caught its OOM", pid)
				}
			}
			if len(ooms) < 16 {
				t.Errorf("%d OOMs in 2 hours of leaks on 8 GPUs", len(ooms))
			}
		}},
		{Growth, func(t *testing.T, h map[int]*history, ooms []OOM) {
			early := 0
			for pid, ph := range h {
				if ph.oom == nil {
					continue
				}
				age := ph.oom.At - ph.first.Started
				if age < 8*time.Minute || age > 45*time.Minute {
					t.Errorf("pid %d: growth reached OOM after %v, want 8 to 45 minutes", pid, age)
				}
				// Retries a minute before the OOM: pressure shows first.
				for i, p := range ph.samples {
					if ph.times[i] <= ph.oom.At-time.Minute && p.AllocRetries > 0 {
						early++
						break
					}
				}
				if f := floors(ph, 120, 120); len(f) > 2 && float64(f[len(f)-2]) > 1.05*float64(f[0]) {
					t.Errorf("pid %d: the floor of active climbed from %d to %d: growth is no leak", pid, f[0], f[len(f)-2])
				}
			}
			if early < len(ooms)*2/3 {
				t.Errorf("only %d of %d growth runs retried a minute before their OOM", early, len(ooms))
			}
		}},
		{Fragmentation, func(t *testing.T, h map[int]*history, ooms []OOM) {
			if len(ooms) > 0 {
				t.Errorf("fragmentation raised %d OOMs", len(ooms))
			}
			for pid, ph := range h {
				if ph.last.AllocRetries < 2 {
					t.Errorf("pid %d: %d retries in 2 hours of fragmentation", pid, ph.last.AllocRetries)
				}
				if split, inactive := avg(ph.samples, func(p Process) uint64 { return p.InactiveSplit }), avg(ph.samples, Process.Inactive); split < inactive/2 {
					t.Errorf("pid %d: inactive_split %.0f of inactive %.0f on average, want most of it", pid, split, inactive)
				}
			}
		}},
		{EvalNoGrad, func(t *testing.T, h map[int]*history, ooms []OOM) {
			noOOMsNoRetries(t, h, ooms)
			for pid, ph := range h {
				f := floors(ph, 120, 300)
				steps := 0
				for i := 1; i < len(f); i++ {
					switch {
					case float64(f[i]) > 1.03*float64(f[i-1]):
						steps++
					case float64(f[i]) < 0.97*float64(f[i-1]):
						t.Errorf("pid %d: the floor fell from %d to %d", pid, f[i-1], f[i])
					}
				}
				if steps < 1 || steps > 2 {
					t.Errorf("pid %d: the floor stepped up %d times, want once (it may straddle two windows)", pid, steps)
				}
			}
		}},
		{Spike, func(t *testing.T, h map[int]*history, ooms []OOM) {
			if len(ooms) < 4 {
				t.Errorf("%d spikes in 2 hours on 8 GPUs", len(ooms))
			}
			for _, o := range ooms {
				if !o.Caught {
					t.Errorf("an inference server did not catch its OOM at %v", o.At)
				}
			}
			for pid, ph := range h {
				for _, p := range ph.samples {
					if p.AllocRetries != p.OOMs {
						t.Errorf("pid %d: %d retries with %d OOMs: a spike gives no warning", pid, p.AllocRetries, p.OOMs)
						break
					}
				}
			}
		}},
		{CacheHeavy, func(t *testing.T, h map[int]*history, ooms []OOM) {
			noOOMsNoRetries(t, h, ooms)
			for pid, ph := range h {
				if in := ph.last.Inactive(); in < 10*GiB || in < ph.last.Reserved/4 {
					t.Errorf("pid %d: inactive %d of reserved %d: want a large idle cache", pid, in, ph.last.Reserved)
				}
			}
		}},
		{MultiRank, func(t *testing.T, h map[int]*history, ooms []OOM) {
			pods := map[string]map[int]bool{} // pod -> GPUs
			for _, ph := range h {
				p := ph.first
				if pods[p.Pod] == nil {
					pods[p.Pod] = map[int]bool{}
				}
				pods[p.Pod][p.GPU] = true
			}
			if len(pods) != 2 || len(pods["ddp-train-0"]) != 4 {
				t.Errorf("pods and their GPUs: %v, want two pods of four GPUs", pods)
			}
			if len(ooms) < 4 {
				t.Errorf("%d OOMs in 2 hours of two leaking multi-rank jobs", len(ooms))
			}
			for _, o := range ooms {
				if o.Rank != 0 {
					t.Errorf("rank %d of %s raised an OOM, want rank 0 (the one that gathers outputs)", o.Rank, o.Pod)
				}
				// Every rank of the pod exits within 30 s of the OOM.
				for pid, ph := range h {
					if ph.first.Pod == o.Pod && ph.first.Started < o.At && ph.times[len(ph.times)-1] > o.At+30*time.Second {
						t.Errorf("rank %d (pid %d) of %s lived on after rank 0's OOM at %v", ph.first.Rank, pid, o.Pod, o.At)
					}
				}
			}
		}},
		{Mix, func(t *testing.T, h map[int]*history, ooms []OOM) {
			kinds := map[string]bool{}
			for _, ph := range h {
				kinds[ph.first.Kind] = true
				if ph.first.ReportsAllocator != (ph.first.Kind != NVMLOnly) {
					t.Errorf("pid %d (%s) reports allocator stats: %v", ph.first.PID, ph.first.Kind, ph.first.ReportsAllocator)
				}
			}
			for _, k := range []string{Steady, Leak, EvalNoGrad, Growth, Fragmentation, Spike, CacheHeavy, MultiRank, NVMLOnly,
				Limit, TooLarge, Neighbours, Contexts, FragmentationOOM} {
				if !kinds[k] {
					t.Errorf("the mix runs no %s process", k)
				}
			}
			caught, uncaught := 0, 0
			for _, o := range ooms {
				if o.Caught {
					caught++
				} else {
					uncaught++
				}
			}
			if caught == 0 || uncaught == 0 {
				t.Errorf("the mix raised %d caught and %d uncaught OOMs, want both", caught, uncaught)
			}
		}},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			t.Parallel()
			h, ooms := histories(t, tc.scenario, 11, 2*time.Hour, dt)
			tc.check(t, h, ooms)
		})
	}
}

func TestMixHasUnattributedMemory(t *testing.T) {
	t.Parallel()
	n, _ := New(Mix, 1)
	tk := n.Advance(time.Minute)
	if tk.GPUs[7].Unattributed != 3*GiB {
		t.Errorf("GPU 7 has %d unattributed bytes, want 3 GiB", tk.GPUs[7].Unattributed)
	}
}

func noOOMsNoRetries(t *testing.T, h map[int]*history, ooms []OOM) {
	t.Helper()
	if len(ooms) > 0 {
		t.Errorf("%d OOMs, want none", len(ooms))
	}
	for pid, ph := range h {
		if ph.last.AllocRetries > 0 {
			t.Errorf("pid %d retried %d times, want never", pid, ph.last.AllocRetries)
		}
	}
}

func minMax(v []uint64) (lo, hi uint64) {
	for i, x := range v {
		if i == 0 || x < lo {
			lo = x
		}
		if x > hi {
			hi = x
		}
	}
	return lo, hi
}

func avg(ps []Process, f func(Process) uint64) float64 {
	s := 0.0
	for _, p := range ps {
		s += float64(f(p))
	}
	return s / float64(len(ps))
}
