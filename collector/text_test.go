package collector

import (
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/foresight"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/exposition"
	"github.com/gpumem/gpumem_exporter/internal/doccheck"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/simulate"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// simulatedExporter wires the simulated node as main does, the node
// naming its processes' pods and Slurm jobs, on a clock that advances one
// second per poll.
func simulatedExporter(t testing.TB, scenarioName string, processesPerGPU int, aggregate string) (*nvmlpoll.Poller, *Exporter, *prometheus.Registry) {
	t.Helper()
	sim, store := simulatedSources(t, scenarioName, processesPerGPU)
	p := pruneOnPoll(nvmlpoll.NewPoller(nvmlpoll.Config{Lib: sim.Advancing()}), store, sim)
	exp, reg := exporterOver(t, p, store, sim, aggregate)
	return p, exp, reg
}

// simulatedSources is the simulated node of simulatedExporter and the
// store its processes report to; a poller over it prunes the store
// (pruneOnPoll).
func simulatedSources(t testing.TB, scenarioName string, processesPerGPU int) (*simulate.Node, *allocstats.Store) {
	t.Helper()
	store := allocstats.NewStore(time.Minute)
	now := time.Unix(1_750_000_000, 0)
	sim, err := simulate.New(simulate.Config{Scenario: scenarioName, ProcessesPerGPU: processesPerGPU, Seed: 1, Open: simulate.Sessions(store),
		Now: func() time.Time { now = now.Add(time.Second); return now }})
	if err != nil {
		t.Fatal(err)
	}
	return sim, store
}

// exporterOver is an exporter of every collector over p, store and the
// node's workload labels, and a registry holding it.
func exporterOver(t testing.TB, p *nvmlpoll.Poller, store *allocstats.Store, sim *simulate.Node, aggregate string) (*Exporter, *prometheus.Registry) {
	t.Helper()
	src := sources(p, store, nil)
	src.Join.Workload = sim
	// The forecaster, as main wires it: every sample, and a join after
	// every poll.
	fc := foresight.New(foresight.Config{})
	store.OnSample(fc)
	src.Join.Forecasts = fc
	p.OnPoll(attribution.NewFollower(src.Join, fc).Observe)
	exp, err := New(src, log.NewNopLogger(), Names()...)
	if err != nil {
		t.Fatal(err)
	}
	exp.aggregate = aggregate
	reg := prometheus.NewRegistry()
	reg.MustRegister(exp)
	return exp, reg
}

// The text path writes what client_golang would, byte for byte, on every
// step of the simulated node's scripts (processes starting, growing,
// reporting, running out of memory and exiting), per process and per pod;
// and promtool accepts it.
func TestTextMatchesClientGolangOnTheSimulatedNode(t *testing.T) {
	for _, tc := range []struct {
		name, scenario string
		perGPU         int
		aggregate      string
		steps          int
	}{
		{"load, 16 processes per GPU", simulate.Load, 16, AggregatePID, 65},
		{"mix", scenario.Mix, 0, AggregatePID, 150},
		{"mix, per pod", scenario.Mix, 0, AggregatePod, 150},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, exp, reg := simulatedExporter(t, tc.scenario, tc.perGPU, tc.aggregate)
			for step := 1; step <= tc.steps; step++ {
				if err := p.Poll(); err != nil {
					t.Fatalf("step %d: poll: %v", step, err)
				}
				compareText(t, exp, reg)
				if t.Failed() {
					t.Fatalf("step %d: the text path differs", step)
				}
			}
			promtool := doccheck.Promtool(t)
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = strings.NewReader(gatherText(t, exp))
			if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("promtool check metrics: %v\n%s", err, out)
			}
		})
	}
}

// A scrape's allocations do not grow with the number of scrapes: the
// 2000th costs what the 20th did.
func TestTextScrapeAllocationsDoNotGrow(t *testing.T) {
	p, exp, _ := simulatedExporter(t, simulate.Load, 4, AggregatePID)
	scrape := func() {
		if err := p.Poll(); err != nil {
			t.Fatal(err)
		}
		if _, err := exp.GatherText(); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 60; i++ { // every slot started
		scrape()
	}
	early := testing.AllocsPerRun(20, scrape)
	for i := 0; i < 500; i++ {
		scrape()
	}
	late := testing.AllocsPerRun(20, scrape)
	if late > early*1.1+10 {
		t.Errorf("allocations per poll and scrape grew from %.0f to %.0f over 500 scrapes", early, late)
	}
}

// Unchanged sources are not rendered again.
func TestTextIsReusedWhileTheViewIsTheSame(t *testing.T) {
	p, exp, _ := simulatedExporter(t, simulate.Load, 4, AggregatePID)
	if err := p.Poll(); err != nil {
		t.Fatal(err)
	}
	first, _ := exp.GatherText()
	second, _ := exp.GatherText()
	same := 0
	for i := range first {
		if strings.HasPrefix(first[i].Name, "gpumem_process_") && &first[i].Text[0] == &second[i].Text[0] {
			same++
		}
	}
	if same == 0 {
		t.Error("the second scrape of an unchanged node rendered the process families again")
	}
	if err := p.Poll(); err != nil {
		t.Fatal(err)
	}
	third, _ := exp.GatherText()
	for i := range third {
		if third[i].Name == "gpumem_process_memory_used_bytes" && string(third[i].Text) == string(first[i].Text) {
			t.Error("a scrape after a poll that changed the node served the old text")
		}
	}
}

// A poll that reads the same figures (processes holding steady) makes a
// new snapshot, but the text rendered from the last one is served again;
// once a figure moves, it is rendered anew.
func TestTextIsReusedAfterAPollThatReadTheSame(t *testing.T) {
	sim, store := simulatedSources(t, simulate.Load, 4)
	// The still NVML: the node moves only when the test steps it.
	p := pruneOnPoll(nvmlpoll.NewPoller(nvmlpoll.Config{Lib: sim.Interface()}), store, sim)
	exp, reg := exporterOver(t, p, store, sim, AggregatePID)
	for i := 0; i < 30; i++ { // processes started and reporting
		sim.Step()
	}
	poll := func() *nvmlpoll.Snapshot {
		t.Helper()
		if err := p.Poll(); err != nil {
			t.Fatal(err)
		}
		return p.Snapshot()
	}
	text := func(fams []exposition.TextFamily, name string) []byte {
		for _, f := range fams {
			if f.Name == name {
				return f.Text
			}
		}
		t.Fatalf("no family %s", name)
		return nil
	}
	const name = "gpumem_process_memory_used_bytes"

	s1 := poll()
	first, _ := exp.GatherText()
	s2 := poll()
	if s1 == s2 || !s1.SameReadings(s2) {
		t.Fatal("the second poll should make a new snapshot of the same readings")
	}
	second, _ := exp.GatherText()
	if &text(first, name)[0] != &text(second, name)[0] {
		t.Error("a poll that read the same figures made the process families render again")
	}
	compareText(t, exp, reg)

	sim.Step()
	poll()
	third, _ := exp.GatherText()
	if string(text(third, name)) == string(text(first, name)) {
		t.Fatal("the node's step changed nothing the test can see")
	}
	if &text(third, name)[0] == &text(first, name)[0] {
		t.Error("a poll that read different figures served the old text")
	}
	compareText(t, exp, reg)
}

type constCollector struct{ values []float64 }

var constDesc = prometheus.NewDesc("gpumem_test_value", "A test value.", nil, nil)

func (c constCollector) Update(_ *Scrape, ch chan<- prometheus.Metric) error {
	for _, v := range c.values {
		ch <- prometheus.MustNewConstMetric(constDesc, prometheus.GaugeValue, v)
	}
	return nil
}

// The collectors that are not row collectors are gathered together, but
// each answers for itself: one whose series clash (a gather error) or
// whose source failed says success 0 and is named in the error, and the
// others are served as they are.
func TestTextPutsAGatherErrorOnItsCollector(t *testing.T) {
	e := &Exporter{logger: log.NewNopLogger(), collectors: map[string]Collector{
		"good":   constCollector{values: []float64{7}},
		"clash":  constCollector{values: []float64{1, 2}}, // two series alike
		"broken": failingCollector{},
	}}
	for range 2 { // the second scrape reuses the registry
		fams, err := e.GatherText()
		if err == nil || !strings.Contains(err.Error(), "collector clash:") || strings.Contains(err.Error(), "collector good") {
			t.Fatalf("GatherText error = %v, want one naming collector clash only", err)
		}
		text := map[string]string{}
		for _, f := range fams {
			text[f.Name] = string(f.Text)
		}
		for collector, want := range map[string]string{"good": "1", "clash": "0", "broken": "0"} {
			line := `gpumem_scrape_collector_success{collector="` + collector + `"} ` + want + "\n"
			if !strings.Contains(text[scrapeSuccessName], line) {
				t.Errorf("success of %s: want %q in\n%s", collector, line, text[scrapeSuccessName])
			}
		}
	}
}
