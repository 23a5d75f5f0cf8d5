package prometheus

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/doccheck"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// The alerts the lead-time test measures.
const (
	alertOOMRisk       = "GPUWorkloadOOMRisk"
	alertLeak          = "GPUWorkloadMemoryLeak"
	alertFullSoon      = "GPUMemoryFullSoon"
	alertFragmentation = "GPUWorkloadFragmentation"
	alertOOM           = "GPUWorkloadOutOfMemory"
	alertIdleCache     = "GPUWorkloadIdleCache"
)

// evalInterval is the rule evaluation interval of the measurement: that
// of the groups of the OOM-risk and OOM alerts, at the 15-second scrape
// the chart configures (promtool evaluates every group at one interval).
const evalInterval = 15 * time.Second

// What the alerts must achieve over the simulated runs.
const (
	minLead       = 2 * time.Minute  // OOM risk's warning before the OOM
	minWarnedRuns = 0.9              // part of leak and growth OOMs warned minLead ahead
	maxFlaps      = 0.02             // OOM risk episodes after the first before an OOM, per OOM
	maxOOMDelay   = scrapeInterval   // OOM alert after the OOM
	maxRiskDelay  = evalInterval     // OOM risk alert after the daemon's first warning (the next scrape's evaluation)
	maxLeakDelay  = 10 * time.Minute // leak alert after the leak started
	// minLeakData is how long a leaking process must live for the leak
	// alert to have the data it needs: the floor of active memory (the
	// least of 2 minutes) leaves the process's start behind after 2m10s,
	// the rule wants a climb in each of two 2-minute spans after that and
	// the alert 2 minutes of for:, at 30-second evaluations. A leak that
	// kills its process sooner (the scenario's fastest, an OOM 5 minutes
	// after training starts) is left out of the leak figures (counted in
	// the table's "too fast" column); the OOM risk alert warns of it.
	minLeakData = 6*time.Minute + 30*time.Second
	openAfter   = 30 * time.Minute // an alert is false when no OOM follows within this
)

// leadTimeRun is one scenario measured with some seeds for some time.
type leadTimeRun struct {
	scenario string
	seeds    []uint64
	duration time.Duration
}

// leadTimeRuns is what the test measures in CI: 32 GPU-hours (8 GPUs, 4
// hours) of each healthy workload, hours of the failing ones (on each GPU a
// run ends in an OOM every 10-40 minutes), and the default mix.
// GPUMEM_LEADTIME_SEEDS=n measures n other seeds of each instead, and
// GPUMEM_LEADTIME_SCALE=k runs each k times as long.
var leadTimeRuns = []leadTimeRun{
	{scenario.Steady, []uint64{1}, 4 * time.Hour},
	{scenario.Fragmentation, []uint64{1}, 4 * time.Hour},
	{scenario.CacheHeavy, []uint64{1}, 4 * time.Hour},
	{scenario.EvalNoGrad, []uint64{1}, 4 * time.Hour},
	{scenario.Leak, []uint64{1, 2}, 3 * time.Hour},
	{scenario.Growth, []uint64{1, 2}, 3 * time.Hour},
	{scenario.MultiRank, []uint64{1, 2}, 3 * time.Hour},
	{scenario.Spike, []uint64{1}, 4 * time.Hour},
	{scenario.Mix, []uint64{1}, 4 * time.Hour},
}

// episode is one stretch of consecutive evaluations at which an alert
// fired for one workload (or GPU).
type episode struct {
	alert, key string
	onset, end time.Duration
}

// episodes groups firings into episodes, by alert and key.
func episodes(fs []firing, key func(firing) string) []episode {
	sort.Slice(fs, func(a, b int) bool { return fs[a].at < fs[b].at })
	open := map[[2]string]*episode{}
	var out []*episode
	for _, f := range fs {
		k := [2]string{f.alert, key(f)}
		if e := open[k]; e != nil && f.at-e.end <= evalInterval {
			e.end = f.at
			continue
		}
		e := &episode{alert: f.alert, key: k[1], onset: f.at, end: f.at}
		open[k] = e
		out = append(out, e)
	}
	res := make([]episode, len(out))
	for i, e := range out {
		res[i] = *e
	}
	return res
}

// alertKey is what an alert is about: the workload, or the GPU.
func alertKey(f firing) string {
	if w, ok := f.labels["workload"]; ok {
		return w
	}
	return "gpu " + f.labels["gpu"]
}

// jobRun is one generation of a job: its processes from start to exit.
type jobRun struct {
	kind, workload string
	gpus           map[int]bool
	start, end     time.Duration // end: exit of its last process, or the measurement's end
	oom            *scenario.OOM // the uncaught OOM that ended it
	caught         []scenario.OOM
}

func jobRuns(tr *truth) []*jobRun {
	byKey := map[string]*jobRun{}
	alive := map[*jobRun]bool{} // a process of the run lives at the end
	var runs []*jobRun
	for _, p := range tr.procs {
		k := p.Job + "@" + p.Started.String()
		r := byKey[k]
		if r == nil {
			r = &jobRun{kind: p.Kind, workload: p.workload, gpus: map[int]bool{}, start: p.Started}
			byKey[k] = r
			runs = append(runs, r)
		}
		r.gpus[p.GPU] = true
		if p.exited == 0 {
			alive[r] = true
		}
		r.end = max(r.end, p.exited)
	}
	for r := range alive {
		r.end = tr.end
	}
	for _, o := range tr.ooms {
		o := o
		for _, r := range runs {
			if r.workload == workloadOf(o.Identity, o.PID) && r.start <= o.At && o.At <= r.end {
				if o.Caught {
					r.caught = append(r.caught, o)
				} else if r.oom == nil {
					r.oom = &o
				}
			}
		}
	}
	sort.Slice(runs, func(a, b int) bool { return runs[a].start < runs[b].start })
	return runs
}

// stats is what the test measured for one kind of workload in one
// scenario.
type stats struct {
	scenario, kind string
	seed           uint64
	runs, ooms     int
	riskLeads      []time.Duration // per uncaught OOM; -1: no warning
	riskFalse      int
	riskFlaps      int             // OOM risk episodes after the first before an OOM: the alert resolved and fired again
	riskAfterWarn  []time.Duration // per uncaught OOM warned in-process and alerted: the alert's onset after the first warning
	warnLeads      []time.Duration // per uncaught OOM; -1: the daemon sent the process no warning before it
	warnFalse      int             // warnings not followed by an OOM of the workload within openAfter
	warnings       int             // warning messages sent
	leakDelays     []time.Duration // per leak run; -1: not found
	leakTooFast    int             // leak runs that OOMed before minLeakData, not found
	leakFalse      int
	fullLeads      []time.Duration // per OOM without a limit; -1: no warning
	fullFalse      int
	fragRuns       int             // runs in which the fragmentation hint fired
	idleRuns       int             // runs in which the idle-cache hint fired
	fired          map[string]int  // episodes of each alert
	oomAlerted     int             // OOMs the OOM alert fired for
	oomDelays      []time.Duration // per OOM alerted: the alert's onset after the OOM
	oomAlertExtra  int             // OOM alert episodes without an OOM
	caughtAlerted  int             // caught OOMs (the process lives on) alerted
	caughtOOMs     int
	notes          []string // what went wrong, for GPUMEM_LEADTIME_DEBUG
}

func (s *stats) label() string {
	if s.scenario == s.kind {
		return s.scenario
	}
	return s.scenario + ": " + s.kind
}

// measure compares the episodes of each alert with what happened.
func measure(name string, tr *truth, eps []episode) map[string]*stats {
	runs := jobRuns(tr)
	out := map[string]*stats{}
	get := func(kind string) *stats {
		if out[kind] == nil {
			out[kind] = &stats{scenario: name, kind: kind}
		}
		return out[kind]
	}
	byAlert := map[string][]episode{}
	for _, e := range eps {
		byAlert[e.alert] = append(byAlert[e.alert], e)
	}
	// first returns the onset of the first episode of alert for key with
	// an onset in [from, to], or -1.
	first := func(alert, key string, from, to time.Duration) time.Duration {
		for _, e := range byAlert[alert] {
			if e.key == key && e.onset >= from && e.onset <= to {
				return e.onset
			}
		}
		return -1
	}
	// count returns how many episodes of alert for key have an onset in
	// [from, to].
	count := func(alert, key string, from, to time.Duration) int {
		n := 0
		for _, e := range byAlert[alert] {
			if e.key == key && e.onset >= from && e.onset <= to {
				n++
			}
		}
		return n
	}
	// firstWarning returns the time of the first warning the daemon sent a
	// process of workload in [from, to], or -1.
	firstWarning := func(workload string, from, to time.Duration) time.Duration {
		for _, w := range tr.warnings {
			if w.workload == workload && w.at >= from && w.at <= to {
				return w.at
			}
		}
		return -1
	}
	for _, r := range runs {
		s := get(r.kind)
		s.runs++
		if r.oom != nil {
			s.ooms++
			lead := time.Duration(-1)
			on := first(alertOOMRisk, r.workload, r.start, r.oom.At)
			if on >= 0 {
				lead = r.oom.At - on
			}
			s.riskLeads = append(s.riskLeads, lead)
			warnLead := time.Duration(-1)
			if w := firstWarning(r.workload, r.start, r.oom.At); w >= 0 {
				warnLead = r.oom.At - w
				if on >= 0 {
					s.riskAfterWarn = append(s.riskAfterWarn, on-w)
					if on-w > maxRiskDelay {
						s.notes = append(s.notes, fmt.Sprintf("%s %s started %v, OOM at %v: fired %v after the first warning", alertOOMRisk, r.workload, r.start, r.oom.At, on-w))
					}
				}
			}
			s.warnLeads = append(s.warnLeads, warnLead)
			if n := count(alertOOMRisk, r.workload, r.start, r.oom.At); n > 1 {
				s.riskFlaps += n - 1
				s.notes = append(s.notes, fmt.Sprintf("%s %s started %v, OOM at %v: %d episodes", alertOOMRisk, r.workload, r.start, r.oom.At, n))
			}
			if lead < minLead {
				s.notes = append(s.notes, fmt.Sprintf("%s %s started %v, OOM at %v: lead %v", alertOOMRisk, r.workload, r.start, r.oom.At, lead))
			}
			if r.oom.Limit == scenario.TotalBytes {
				lead := time.Duration(-1)
				if on := first(alertFullSoon, "gpu "+strconv.Itoa(r.oom.GPU), r.start, r.oom.At); on >= 0 {
					lead = r.oom.At - on
				}
				s.fullLeads = append(s.fullLeads, lead)
			}
			if on := first(alertOOM, r.workload, r.oom.At, r.oom.At+2*time.Minute); on >= 0 {
				s.oomAlerted++
				s.oomDelays = append(s.oomDelays, on-r.oom.At)
			}
		}
		for _, o := range r.caught {
			s.ooms++
			s.caughtOOMs++
			if on := first(alertOOM, r.workload, o.At, o.At+2*time.Minute); on >= 0 {
				s.caughtAlerted++
				s.oomAlerted++
				s.oomDelays = append(s.oomDelays, on-o.At)
			}
		}
		if r.kind == scenario.Leak || r.kind == scenario.MultiRank {
			delay := time.Duration(-1)
			if on := first(alertLeak, r.workload, r.start, r.end); on >= 0 {
				delay = on - r.start
			}
			switch {
			case delay < 0 && r.oom != nil && r.oom.At-r.start < minLeakData:
				s.leakTooFast++
			case delay >= 0 || r.oom != nil || r.end-r.start >= maxLeakDelay:
				s.leakDelays = append(s.leakDelays, delay)
				if delay < 0 || delay > maxLeakDelay {
					s.notes = append(s.notes, fmt.Sprintf("%s %s started %v, ended %v (OOM %v): found after %v", alertLeak, r.workload, r.start, r.end, r.oom != nil, delay))
				}
			}
		}
		if first(alertFragmentation, r.workload, r.start, r.end) >= 0 {
			s.fragRuns++
		}
		if first(alertIdleCache, r.workload, r.start, r.end) >= 0 {
			s.idleRuns++
		}
	}
	// runOf returns the run of workload key (or on GPU key) at t.
	runOf := func(key string, t time.Duration) *jobRun {
		for _, r := range runs {
			match := r.workload == key
			if g, ok := strings.CutPrefix(key, "gpu "); ok {
				n, _ := strconv.Atoi(g)
				match = r.gpus[n]
			}
			if match && r.start <= t && t <= r.end+time.Minute {
				return r
			}
		}
		return nil
	}
	// An OOM follows an alert when one comes within openAfter, on its
	// workload (or GPU). Alerts too close to the end to know are left out.
	oomFollows := func(key string, t time.Duration) (follows, known bool) {
		for _, o := range tr.ooms {
			match := workloadOf(o.Identity, o.PID) == key || key == "gpu "+strconv.Itoa(o.GPU)
			if match && o.At >= t && o.At <= t+openAfter {
				return true, true
			}
		}
		return false, t+openAfter <= tr.end
	}
	for _, w := range tr.warnings {
		r := runOf(w.workload, w.at)
		kind := "?"
		if r != nil {
			kind = r.kind
		}
		s := get(kind)
		s.warnings++
		if follows, known := oomFollows(w.workload, w.at); !follows && known {
			s.warnFalse++
			s.notes = append(s.notes, fmt.Sprintf("warning to %s pid %d false at %v: %s over %v from %.2f to %.2f GiB, %.2f GiB now, eta %v", w.workload, w.pid, w.at, w.fc.Cause, w.fc.Span, gib(w.fc.From), gib(w.fc.To), gib(w.fc.Level), w.eta))
		}
	}
	for _, e := range eps {
		r := runOf(e.key, e.onset)
		kind := "?"
		if r != nil {
			kind = r.kind
		}
		s := get(kind)
		if s.fired == nil {
			s.fired = map[string]int{}
		}
		s.fired[e.alert]++
		switch e.alert {
		case alertOOMRisk, alertFullSoon:
			if follows, known := oomFollows(e.key, e.onset); !follows && known {
				s.notes = append(s.notes, fmt.Sprintf("%s %s false at %v-%v", e.alert, e.key, e.onset, e.end))
				if e.alert == alertOOMRisk {
					s.riskFalse++
				} else {
					s.fullFalse++
				}
			}
		case alertLeak:
			if kind != scenario.Leak && kind != scenario.MultiRank {
				var oomAt time.Duration
				if r != nil && r.oom != nil {
					oomAt = r.oom.At
				}
				s.notes = append(s.notes, fmt.Sprintf("%s %s false at %v-%v (run %s from %v, OOM at %v)", e.alert, e.key, e.onset, e.end, kind, r.start, oomAt))
				s.leakFalse++
			}
		case alertOOM:
			found := false
			for _, o := range tr.ooms {
				if workloadOf(o.Identity, o.PID) == e.key && o.At <= e.onset && o.At >= e.onset-2*time.Minute {
					found = true
				}
			}
			if !found {
				s.oomAlertExtra++
			}
		}
	}
	return out
}

func TestAlertLeadTime(t *testing.T) {
	promtool := doccheck.Promtool(t)
	if testing.Short() {
		t.Skip("the lead-time test runs promtool over simulated days")
	}
	dir := t.TempDir()
	if keep := os.Getenv("GPUMEM_LEADTIME_DIR"); keep != "" {
		dir = keep // keep the generated files to look at
	}
	alerts := []string{alertOOMRisk, alertLeak, alertFullSoon, alertFragmentation, alertOOM, alertIdleCache}
	for _, a := range alerts {
		if _, ok := alertBodies(t)[a]; !ok {
			t.Fatalf("%s has no alert %s", rulesFile, a)
		}
	}
	rulesPath, names, err := rulesForAlerts(dir, alerts)
	if err != nil {
		t.Fatal(err)
	}

	type job struct {
		run  leadTimeRun
		seed uint64
	}
	var jobs []job
	for _, r := range leadTimeRuns {
		if only := os.Getenv("GPUMEM_LEADTIME_SCENARIOS"); only != "" && !strings.Contains(","+only+",", ","+r.scenario+",") {
			continue
		}
		seeds := r.seeds
		if n, _ := strconv.Atoi(os.Getenv("GPUMEM_LEADTIME_SEEDS")); n > 0 {
			// More seeds than CI runs, to check the figures hold.
			seeds = nil
			for s := uint64(1); s <= uint64(n); s++ {
				seeds = append(seeds, 100+s)
			}
		}
		if scale, _ := strconv.Atoi(os.Getenv("GPUMEM_LEADTIME_SCALE")); scale > 1 {
			r.duration *= time.Duration(scale) // longer runs than CI's
		}
		for _, seed := range seeds {
			jobs = append(jobs, job{r, seed})
		}
	}
	results := make([]map[string]*stats, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	start := time.Now()
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			began := time.Now()
			set, tr, err := simulate(j.run.scenario, j.seed, j.run.duration)
			if err != nil {
				errs[i] = err
				return
			}
			file := filepath.Join(dir, fmt.Sprintf("%s-%d.yml", j.run.scenario, j.seed))
			if err := writeTestFile(file, rulesPath, set, names, alerts, evalInterval); err != nil {
				errs[i] = err
				return
			}
			simulated := time.Since(began)
			fs, err := promtoolFirings(promtool, file)
			if os.Getenv("GPUMEM_LEADTIME_DEBUG") != "" {
				t.Logf("%s seed %d: simulated and written in %v, promtool took %v", j.run.scenario, j.seed, simulated.Round(time.Millisecond), (time.Since(began) - simulated).Round(time.Millisecond))
			}
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = measure(j.run.scenario, tr, episodes(fs, alertKey))
			for _, s := range results[i] {
				s.seed = j.seed
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	merged := map[string]*stats{}
	var order []string
	for _, res := range results {
		kinds := make([]string, 0, len(res))
		for k := range res {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			s := res[k]
			m := merged[s.label()]
			if m == nil {
				m = &stats{scenario: s.scenario, kind: s.kind}
				merged[s.label()] = m
				order = append(order, s.label())
			}
			m.add(s)
		}
	}
	table := leadTimeTable(order, merged)
	t.Logf("lead times at a %v scrape and a %v evaluation interval (%v):\n%s", scrapeInterval, evalInterval, time.Since(start).Round(time.Second), table)
	if os.Getenv("GPUMEM_LEADTIME_DEBUG") != "" {
		for _, k := range order {
			for _, n := range merged[k].notes {
				t.Logf("%s: %s", k, n)
			}
		}
	}
	checkTargets(t, merged)
}

func (m *stats) add(s *stats) {
	m.runs += s.runs
	m.ooms += s.ooms
	m.riskLeads = append(m.riskLeads, s.riskLeads...)
	m.riskFalse += s.riskFalse
	m.riskFlaps += s.riskFlaps
	m.riskAfterWarn = append(m.riskAfterWarn, s.riskAfterWarn...)
	m.warnLeads = append(m.warnLeads, s.warnLeads...)
	m.warnFalse += s.warnFalse
	m.warnings += s.warnings
	m.oomDelays = append(m.oomDelays, s.oomDelays...)
	m.leakDelays = append(m.leakDelays, s.leakDelays...)
	m.leakTooFast += s.leakTooFast
	m.leakFalse += s.leakFalse
	m.fullLeads = append(m.fullLeads, s.fullLeads...)
	m.fullFalse += s.fullFalse
	m.fragRuns += s.fragRuns
	m.idleRuns += s.idleRuns
	if m.fired == nil {
		m.fired = map[string]int{}
	}
	for a, n := range s.fired {
		m.fired[a] += n
	}
	m.oomAlerted += s.oomAlerted
	m.oomAlertExtra += s.oomAlertExtra
	m.caughtAlerted += s.caughtAlerted
	m.caughtOOMs += s.caughtOOMs
	for _, n := range s.notes {
		m.notes = append(m.notes, fmt.Sprintf("seed %d: %s", s.seed, n))
	}
}

// summary says how many of ds are at least least (or, with atMost, at most
// most), and their median, as "n/N, median m".
func summary(ds []time.Duration, ok func(time.Duration) bool) string {
	if len(ds) == 0 {
		return "-"
	}
	var found []time.Duration
	good := 0
	for _, d := range ds {
		if d >= 0 {
			found = append(found, d)
		}
		if ok(d) {
			good++
		}
	}
	med := "-"
	if len(found) > 0 {
		sort.Slice(found, func(a, b int) bool { return found[a] < found[b] })
		med = minutes(found[len(found)/2])
	}
	return fmt.Sprintf("%d/%d, median %s", good, len(ds), med)
}

func gib(v uint64) float64 { return float64(v) / (1 << 30) }

func minutes(d time.Duration) string { return fmt.Sprintf("%.1fm", d.Minutes()) }

func leadTimeTable(order []string, merged map[string]*stats) string {
	var b strings.Builder
	b.WriteString("| scenario: workload | runs | OOMs | in-process warning: ≥2m ahead | in-process warning: sent, false | OOM risk: warned ≥2m ahead | OOM risk: after the warning | OOM risk: false | OOM risk: flaps | leak: found ≤10m after start | leak: too fast | leak: false | GPU full soon: warned ahead | GPU full soon: false | fragmentation: runs | idle cache: runs | OOM alert: OOMs alerted | OOM alert: after the OOM | OOM alert: extra |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range order {
		s := merged[k]
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %d, %d | %s | %s | %d | %d | %s | %d | %d | %s | %d | %d | %d | %d/%d | %s | %d |\n",
			s.label(), s.runs, s.ooms,
			summary(s.warnLeads, func(d time.Duration) bool { return d >= minLead }), s.warnings, s.warnFalse,
			summary(s.riskLeads, func(d time.Duration) bool { return d >= minLead }), spread(s.riskAfterWarn), s.riskFalse, s.riskFlaps,
			summary(s.leakDelays, func(d time.Duration) bool { return d >= 0 && d <= maxLeakDelay }), s.leakTooFast, s.leakFalse,
			summary(s.fullLeads, func(d time.Duration) bool { return d > 0 }), s.fullFalse,
			s.fragRuns, s.idleRuns, s.oomAlerted, s.ooms, spread(s.oomDelays), s.oomAlertExtra)
	}
	return b.String()
}

// spread says the median and the most of ds in seconds, as "median 15s,
// at most 30s".
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return fmt.Sprintf("median %.0fs, at most %.0fs", sorted[len(sorted)/2].Seconds(), sorted[len(sorted)-1].Seconds())
}

// checkTargets fails the test where the targets above are not met.
func checkTargets(t *testing.T, merged map[string]*stats) {
	t.Helper()
	fraction := func(ds []time.Duration, ok func(time.Duration) bool) (int, float64) {
		n := 0
		for _, d := range ds {
			if ok(d) {
				n++
			}
		}
		if len(ds) == 0 {
			return 0, 0
		}
		return n, float64(n) / float64(len(ds))
	}
	mix := map[string]int{}
	for _, s := range merged {
		if s.scenario == scenario.Mix {
			for a, n := range s.fired {
				mix[a] += n
			}
		}
		healthy := false
		switch s.kind {
		case scenario.Leak, scenario.Growth, scenario.MultiRank:
			n, f := fraction(s.riskLeads, func(d time.Duration) bool { return d >= minLead })
			if f < minWarnedRuns {
				t.Errorf("%s: %s warned %v ahead of %d of %d OOMs, want at least %.0f%%", s.label(), alertOOMRisk, minLead, n, len(s.riskLeads), 100*minWarnedRuns)
			}
			n, f = fraction(s.warnLeads, func(d time.Duration) bool { return d >= minLead })
			if f < minWarnedRuns {
				t.Errorf("%s: the daemon warned the process %v ahead of %d of %d OOMs, want at least %.0f%%", s.label(), minLead, n, len(s.warnLeads), 100*minWarnedRuns)
			}
		case scenario.Steady, scenario.Fragmentation, scenario.CacheHeavy, scenario.EvalNoGrad, scenario.Spike, scenario.NVMLOnly:
			healthy = true
		}
		if float64(s.riskFlaps) > maxFlaps*float64(len(s.riskLeads)) {
			t.Errorf("%s: %s resolved and fired again %d times before %d OOMs, want it to hold until the OOM (at most %.0f%% of them)", s.label(), alertOOMRisk, s.riskFlaps, len(s.riskLeads), 100*maxFlaps)
		}
		if s.warnFalse > 0 {
			t.Errorf("%s: the daemon sent %d warnings not followed by an OOM within %v, want none", s.label(), s.warnFalse, openAfter)
		}
		if n, f := fraction(s.riskAfterWarn, func(d time.Duration) bool { return d <= maxRiskDelay }); len(s.riskAfterWarn) > 0 && f < minWarnedRuns {
			t.Errorf("%s: %s fired within %v of the daemon's first warning before %d of %d OOMs, want at least %.0f%%", s.label(), alertOOMRisk, maxRiskDelay, n, len(s.riskAfterWarn), 100*minWarnedRuns)
		}
		if late := slices.IndexFunc(s.oomDelays, func(d time.Duration) bool { return d > maxOOMDelay }); late >= 0 {
			t.Errorf("%s: %s fired %v after an OOM, want within %v", s.label(), alertOOM, s.oomDelays[late], maxOOMDelay)
		}
		if healthy && s.riskFalse > 0 {
			t.Errorf("%s: %s fired %d times, want never", s.label(), alertOOMRisk, s.riskFalse)
		}
		if healthy && s.fullFalse > 0 {
			t.Errorf("%s: %s fired %d times, want never", s.label(), alertFullSoon, s.fullFalse)
		}
		if s.kind == scenario.Leak || s.kind == scenario.MultiRank {
			if n, _ := fraction(s.leakDelays, func(d time.Duration) bool { return d >= 0 && d <= maxLeakDelay }); n < len(s.leakDelays) {
				t.Errorf("%s: %s found %d of %d leaks within %v of their start, want all", s.label(), alertLeak, n, len(s.leakDelays), maxLeakDelay)
			}
		} else if s.leakFalse > 0 {
			t.Errorf("%s: %s fired %d times on a workload that does not leak", s.label(), alertLeak, s.leakFalse)
		}
		if s.oomAlerted < s.ooms {
			t.Errorf("%s: %s fired for %d of %d OOMs, want every one (the exporter keeps an exited process's counters for --allocstats.oom-linger)", s.label(), alertOOM, s.oomAlerted, s.ooms)
		}
		if s.caughtAlerted < s.caughtOOMs {
			t.Errorf("%s: %s fired for %d of %d OOMs that the process caught and lived on", s.label(), alertOOM, s.caughtAlerted, s.caughtOOMs)
		}
		if s.oomAlertExtra > 0 {
			t.Errorf("%s: %s fired %d times without a new OOM: each OOM must count once", s.label(), alertOOM, s.oomAlertExtra)
		}
		if s.kind == scenario.Fragmentation {
			if s.fragRuns < s.runs/2 {
				t.Errorf("%s: %s fired in only %d of %d fragmented runs", s.label(), alertFragmentation, s.fragRuns, s.runs)
			}
		} else if s.fragRuns > 0 {
			t.Errorf("%s: %s fired in %d runs without fragmentation", s.label(), alertFragmentation, s.fragRuns)
		}
	}
	if len(mix) > 0 {
		for _, a := range []string{alertOOMRisk, alertLeak, alertFullSoon, alertFragmentation, alertOOM, alertIdleCache} {
			if mix[a] == 0 {
				t.Errorf("%s never fired in the default mix, which should keep every alert moving", a)
			}
		}
	}
}
