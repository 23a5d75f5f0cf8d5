package diagnosis

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// verdicts runs a scenario of the simulated node for d, one second at a
// time, noting every process's active memory as the exporter would (the
// simulated clock stands in for the wall clock), and gives the verdict on
// each of its OOMs by the kind of workload that raised it.
func verdicts(t *testing.T, name string, seed uint64, d time.Duration) map[string]map[Cause]int {
	t.Helper()
	n, err := scenario.New(name, seed)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Unix(1_800_000_000, 0)
	h := NewHistory()
	key := func(pid, gpu int) Key { return Key{PID: uint32(pid), UUID: fmt.Sprint(gpu)} }
	out := map[string]map[Cause]int{}
	for elapsed := time.Duration(0); elapsed < d; elapsed += time.Second {
		tk := n.Advance(time.Second)
		now := base.Add(tk.Elapsed)
		for _, o := range tk.OOMs {
			at := base.Add(o.At)
			g := tk.GPUs[o.GPU]
			self := o.AtFailure
			in := Input{
				Requested: o.Requested, Total: g.Total, DriverReserved: g.DriverReserved,
				Free: p(o.Free),
				Self: Process{PID: uint32(o.PID), Reserved: p(self.Reserved), Active: p(self.Active),
					InactiveSplit: p(self.InactiveSplit), Context: p(self.Context), Used: p(self.Used())},
				Trend: h.Trend(key(o.PID, o.GPU), at),
			}
			if o.Limit < g.Total {
				in.Limit = p(o.Limit)
			}
			for _, q := range tk.Processes {
				if q.GPU != o.GPU || q.PID == o.PID {
					continue
				}
				other := Process{PID: uint32(q.PID), Used: p(q.Used())}
				if q.ReportsAllocator {
					other.Context, other.Reserved, other.Active = p(q.Context), p(q.Reserved), p(q.Active)
				}
				in.Others = append(in.Others, other)
			}
			v := Diagnose(in)
			if out[o.Kind] == nil {
				out[o.Kind] = map[Cause]int{}
			}
			out[o.Kind][v.Cause]++
			if want, ok := expected[o.Kind]; ok && v.Cause != want && !slices.Contains(v.Contributing, want) {
				out[o.Kind][notContributing]++
			}
			if testing.Verbose() && v.Cause != expected[o.Kind] {
				t.Logf("%s pid %d at %s: %s: %s trend %+v", o.Kind, o.PID, o.At, v.Cause, v.Summary, in.Trend)
			}
		}
		for _, q := range tk.Processes {
			if q.ReportsAllocator {
				h.Note(key(q.PID, q.GPU), now, q.Active)
			}
		}
	}
	return out
}

const notContributing Cause = "(not even contributing)"

// expected is the cause each kind of simulated workload dies of.
var expected = map[string]Cause{
	scenario.Limit:            Limit,
	scenario.TooLarge:         TooLarge,
	scenario.Neighbours:       Neighbours,
	scenario.Contexts:         Contexts,
	scenario.FragmentationOOM: Fragmentation,
	scenario.Leak:             Leak,
	scenario.Growth:           Growth,
}

func describe(m map[Cause]int) string {
	var parts []string
	for c, n := range m {
		parts = append(parts, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// TestSimulatedNodeOOMsGetTheCauseOfTheirKind: each kind of OOM the
// simulated node produces, alone and in the default mix, is diagnosed as
// that kind: all of them for the kinds decided by the figures at the
// failure (too large, neighbours, contexts, fragmentation); for the kinds
// read from a trend, whose steps fall anywhere in the window, three in
// five first and nine in ten with that cause at least contributing (a
// growing batch reads as fragmentation where its split cache would have
// held the request, as the limit under its own limit with the GPU's room).
func TestSimulatedNodeOOMsGetTheCauseOfTheirKind(t *testing.T) {
	runs := []struct {
		scenario string
		d        time.Duration
	}{
		{scenario.Mix, 3 * time.Hour},
		{scenario.Limit, time.Hour},
		{scenario.TooLarge, time.Hour},
		{scenario.Neighbours, time.Hour},
		{scenario.Contexts, time.Hour},
		{scenario.FragmentationOOM, time.Hour},
		{scenario.Leak, 2 * time.Hour},
		{scenario.Growth, 2 * time.Hour},
	}
	for _, r := range runs {
		t.Run(r.scenario, func(t *testing.T) {
			t.Parallel()
			got := verdicts(t, r.scenario, 1, r.d)
			for kind, want := range expected {
				causes := got[kind]
				total := 0
				for c, n := range causes {
					if c != notContributing {
						total += n
					}
				}
				if r.scenario != scenario.Mix && kind != r.scenario {
					continue
				}
				if total == 0 {
					t.Errorf("no OOM of kind %s in %s of %s", kind, r.d, r.scenario)
					continue
				}
				need, missed := total, causes[notContributing]
				switch kind {
				case scenario.Leak, scenario.Growth, scenario.Limit:
					// Their trends depend on where in the window their
					// steps fall: three in five first, nine in ten at
					// least among the contributing causes.
					need = (total*3 + 4) / 5
					if missed*10 > total {
						t.Errorf("%s: %d of %d OOMs had not even %s among their contributing causes; causes: %s", kind, missed, total, want, describe(causes))
					}
				}
				if causes[want] < need {
					t.Errorf("%s: %d of %d OOMs diagnosed %s, want at least %d; causes: %s", kind, causes[want], total, want, need, describe(causes))
				}
			}
		})
	}
}
