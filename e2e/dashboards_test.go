package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/dashboardtest"
)

var dashboardsDir = filepath.Join(repoRoot, "dashboards")

// The dashboards the project ships; any other *.json in dashboards/ is
// checked as well.
var wantDashboards = []string{"fleet.json", "node.json", "workload.json"}

type dashboard struct {
	file   string
	Panels []panel `json:"panels"`
	// Templating holds the variables.
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name string `json:"name"`
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		RefID   string `json:"refId"`
		Expr    string `json:"expr"`
		Instant bool   `json:"instant"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func loadDashboards(t *testing.T) []dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	var out []dashboard
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := dashboard{file: filepath.Base(f)}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s does not parse: %v", f, err)
		}
		have[d.file] = true
		out = append(out, d)
	}
	for _, f := range wantDashboards {
		if !have[f] {
			t.Errorf("no dashboard %s in %s", f, dashboardsDir)
		}
	}
	return out
}

func (d dashboard) panels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// check is one query of a dashboard: a panel's target or an annotation
// (evaluated as Grafana does: an instant query, or a range query over the
// test's data), or a variable's label_values(selector, label).
type check struct {
	where    string
	expr     string // with Grafana's variables, substituted at each evaluation
	instant  bool
	label    string // for a variable
	selector string
	pick     *selection // the variables' values; nil: All
}

// selection is what a user picked in the variables' drop-downs.
type selection struct {
	name   string
	values map[string]string
	// expects says whether the query must return data for this selection.
	expects func(expr string) bool
}

// oneWorkload is the two-rank pod of the mix, on the GPU of its leaking
// rank 0: with every drop-down set, each label a query filters on must be
// one its series carry (a recording rule without gpu, say, would empty the
// panel). Some panels are rightly empty for it: it sets no limit, its
// out-of-memory errors and retries come in bursts, the growth of its floor
// can take longer to show than the test waits, it has no process outside
// Kubernetes nor one without allocator statistics, and alerts are not
// narrowed by the variables.
var oneWorkload = &selection{
	name: "workload ml/ddp-train-0 on GPU 6",
	values: map[string]string{
		"gpu": "6", "namespace": "ml", "pod": "ddp-train-0", "workload": "ml/ddp-train-0",
	},
	expects: func(expr string) bool {
		return !regexp.MustCompile(`limit_bytes|ooms_total|last_oom|alloc_retries|ALERTS|pod=""|unless on|deriv\(`).MatchString(expr)
	},
}

// checks returns the queries of the dashboards with every variable All,
// and those that must return data for oneWorkload.
func checks(t *testing.T, ds []dashboard) []check {
	t.Helper()
	all := allChecks(t, ds)
	out := all
	for _, c := range all {
		if c.label != "" || oneWorkload.expects(c.expr) {
			c.pick = oneWorkload
			c.where += " (" + oneWorkload.name + ")"
			out = append(out, c)
		}
	}
	return out
}

func allChecks(t *testing.T, ds []dashboard) []check {
	t.Helper()
	var out []check
	for _, d := range ds {
		for _, p := range d.panels() {
			for _, tg := range p.Targets {
				out = append(out, check{
					where: fmt.Sprintf("%s panel %d %q target %s", d.file, p.ID, p.Title, tg.RefID),
					expr:  tg.Expr, instant: tg.Instant,
				})
			}
		}
		for _, a := range d.Annotations.List {
			if a.Expr != "" {
				out = append(out, check{where: fmt.Sprintf("%s annotation %q", d.file, a.Name), expr: a.Expr})
			}
		}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			selector, label, err := dashboardtest.LabelValues(v.Query)
			if err != nil {
				t.Fatalf("%s variable %s: %v", d.file, v.Name, err)
			}
			out = append(out, check{where: fmt.Sprintf("%s variable %s", d.file, v.Name), selector: selector, label: label})
		}
	}
	return out
}

// grafanaVariable matches $name, ${name}, ${name:format} and [[name]].
var grafanaVariable = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// Grafana's interval variables in the test: graphs are evaluated every
// graphStep (Grafana's step is $__interval); $__rate_interval is what
// Grafana picks for a 1 s scrape interval and that step, rounded up.
const (
	graphStep    = 5 * time.Second
	rateInterval = "20s"
)

// substitute replaces the dashboards' variables as Grafana would, with
// values that exist: the job and instance of the test's target, the others
// as picked (nil: All, .*), $__range the window. An unknown variable is an
// error.
func (s *stack) substitute(expr string, window time.Duration, pick *selection) (string, error) {
	values := map[string]string{
		"__range":         promDuration(window),
		"__interval":      promDuration(graphStep),
		"__rate_interval": rateInterval,
		"job":             "gpumem",
		"instance":        s.exporterAddr,
		"gpu":             ".*",
		"namespace":       ".*",
		"pod":             ".*",
		"workload":        ".*",
	}
	if pick != nil {
		for k, v := range pick.values {
			values[k] = regexp.QuoteMeta(v)
		}
	}
	var unknown []string
	out := grafanaVariable.ReplaceAllStringFunc(expr, func(v string) string {
		m := grafanaVariable.FindStringSubmatch(v)
		if val, ok := values[m[1]+m[2]+m[3]]; ok {
			return val
		}
		unknown = append(unknown, v)
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("variables the test does not know: %s", strings.Join(unknown, ", "))
	}
	return out, nil
}

func promDuration(d time.Duration) string {
	return fmt.Sprintf("%dms", d.Milliseconds())
}

// hasData evaluates c at now over the data since Prometheus started.
func (s *stack) hasData(ctx context.Context, c check, now time.Time) (bool, error) {
	window := now.Sub(s.promStart).Truncate(time.Second) + time.Second
	if c.label != "" {
		sel, err := s.substitute(c.selector, window, c.pick)
		if err != nil {
			return false, err
		}
		values, err := s.labelValues(ctx, c.label, sel, s.promStart, now)
		if err != nil {
			return false, err
		}
		for _, v := range values {
			if v != "" {
				return true, nil
			}
		}
		return false, nil
	}
	expr, err := s.substitute(c.expr, window, c.pick)
	if err != nil {
		return false, err
	}
	var res []series
	if c.instant {
		res, err = s.query(ctx, expr, now)
	} else {
		res, err = s.queryRange(ctx, expr, s.promStart, now, graphStep)
	}
	if err != nil {
		return false, err
	}
	for _, r := range res {
		if len(r.samples) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// TestEveryQueryReturnsData evaluates every panel target, annotation and
// variable of every dashboard against the real Prometheus until each has
// returned data once, and lists those that never did: with every variable
// All, and again with one workload picked (oneWorkload).
func TestEveryQueryReturnsData(t *testing.T) {
	s := requireStack(t)
	cs := checks(t, loadDashboards(t))
	ctx := context.Background()
	deadline := s.promStart.Add(dataTimeout)
	pending := cs
	var slowest check
	var slowestAfter time.Duration
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for len(pending) > 0 {
		now := time.Now()
		var still []check
		for _, c := range pending {
			ok, err := s.hasData(ctx, c, now)
			switch {
			case err != nil:
				t.Errorf("%s: %v\nquery: %s", c.where, err, c.expr+c.selector)
			case !ok:
				still = append(still, c)
			default:
				if after := now.Sub(s.promStart); after > slowestAfter {
					slowest, slowestAfter = c, after
				}
			}
		}
		pending = still
		if len(pending) == 0 || now.After(deadline) {
			break
		}
		<-tick.C
	}
	for _, c := range pending {
		q := c.expr
		if c.label != "" {
			q = fmt.Sprintf("label_values(%s, %s)", c.selector, c.label)
		}
		t.Errorf("%s returned no data within %s of Prometheus's start:\n%s", c.where, dataTimeout, q)
	}
	if len(pending) > 0 {
		t.Logf("%d of %d queries returned no data", len(pending), len(cs))
	} else {
		t.Logf("all %d queries returned data %s after Prometheus started, the last %s", len(cs), slowestAfter.Round(time.Second), slowest.where)
	}
}

// processKey names one process on one GPU.
type processKey struct{ gpu, pid string }

func (k processKey) String() string { return "GPU " + k.gpu + " pid " + k.pid }

// oomTruth counts, from Prometheus's raw samples, the out-of-memory errors
// of each process in the window (end - window, end]: the counter's rise for
// a series that has a sample at or before the window's start, its last
// value for a series that starts inside it (a process starts at 0). last
// is the time of each series's last sample.
func (s *stack) oomTruth(ctx context.Context, end time.Time, window time.Duration) (counts map[processKey]float64, last map[processKey]float64, err error) {
	return s.oomTruthOf(ctx, rawOOMs, end, window)
}

// The OOM counters as scraped, and as the rules record those of processes
// that raised one (what the fleet dashboard reads): the recorded series
// take each step at the first evaluation after its scrape.
const (
	rawOOMs      = "gpumem_allocator_ooms_total"
	recordedOOMs = "process:gpumem_allocator_ooms_total:nonzero"
)

// oomsOf is the counter a panel's query counts.
func oomsOf(expr string) string {
	if strings.Contains(expr, recordedOOMs) {
		return recordedOOMs
	}
	return rawOOMs
}

// oomTruthOf is oomTruth over the samples of metric.
func (s *stack) oomTruthOf(ctx context.Context, metric string, end time.Time, window time.Duration) (counts map[processKey]float64, last map[processKey]float64, err error) {
	// The base is looked up as an offset would: up to 5 minutes back.
	raw, err := s.query(ctx, fmt.Sprintf("%s[%s]", metric, promDuration(window+5*time.Minute)), end)
	if err != nil {
		return nil, nil, err
	}
	startMs := end.Add(-window).UnixMilli()
	counts, last = map[processKey]float64{}, map[processKey]float64{}
	for _, r := range raw {
		k := processKey{r.labels["gpu"], r.labels["pid"]}
		var base, lastIn float64
		var hasBase, hasIn bool
		for _, smp := range r.samples {
			if int64(math.Round(smp.t*1000)) <= startMs {
				base, hasBase = smp.v, true
			} else {
				lastIn, hasIn = smp.v, true
			}
		}
		if len(r.samples) > 0 {
			last[k] = r.samples[len(r.samples)-1].t
		}
		if !hasIn {
			continue
		}
		if hasBase {
			counts[k] += lastIn - base
		} else {
			counts[k] += lastIn
		}
	}
	return counts, last, nil
}

// waitIngestedAfter waits until Prometheus holds a scrape of the exporter
// and an evaluation of the rules stamped after end. A scrape stamped
// before end (its start) may reach the database after a first query at end
// has run, and a later query at the same end would then see one more
// sample: under load the raw samples and the panels disagreed so. Scrapes
// of one target, and evaluations of one group, run one after the other,
// so once one stamped after end is in, all those before it are.
func (s *stack) waitIngestedAfter(t *testing.T, ctx context.Context, end time.Time) {
	t.Helper()
	after := float64(end.UnixMilli()) / 1000
	deadline := time.Now().Add(dataTimeout)
	for _, q := range []string{"max(timestamp(up))", "max(timestamp(" + recordedOOMs + "))"} {
		for {
			res, err := s.query(ctx, q, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if len(res) > 0 && len(res[0].samples) > 0 && res[0].samples[0].v > after {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: nothing stamped after %s within %s\n%s", q, end.Format(time.StampMilli), dataTimeout, s.logs())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func sum(m map[processKey]float64) float64 {
	var total float64
	for _, v := range m {
		total += v
	}
	return total
}

// oomCountTargets are the instant targets that count out-of-memory errors
// in the time range: refId A of an instant query of the OOM counter over
// $__range (the tables' count column and the fleet's total).
func oomCountTargets(ds []dashboard) []check {
	var out []check
	for _, d := range ds {
		for _, p := range d.panels() {
			for _, tg := range p.Targets {
				if tg.Instant && tg.RefID == "A" && strings.Contains(tg.Expr, "gpumem_allocator_ooms_total") && strings.Contains(tg.Expr, "$__range") {
					out = append(out, check{where: fmt.Sprintf("%s panel %d %q", d.file, p.ID, p.Title), expr: tg.Expr, instant: true})
				}
			}
		}
	}
	return out
}

// oomGraphTargets are the graphs of out-of-memory errors per interval.
func oomGraphTargets(ds []dashboard) []check {
	var out []check
	for _, d := range ds {
		for _, p := range d.panels() {
			for _, tg := range p.Targets {
				if !tg.Instant && strings.Contains(tg.Expr, "gpumem_allocator_ooms_total") && strings.Contains(tg.Expr, "$__interval") {
					out = append(out, check{where: fmt.Sprintf("%s panel %d %q", d.file, p.ID, p.Title), expr: tg.Expr})
				}
			}
		}
	}
	return out
}

// TestOOMPanelsCountEachErrorOnce compares the dashboards' out-of-memory
// counts with the errors in Prometheus's raw samples (each counter step
// once: no extrapolation, no error counted twice through a join, none lost
// when its process has exited), over the whole run and over its second
// half (where the counts of processes older than the window are a rise),
// and the graphs' bars, summed, with the count over the same time. The
// exporter's own OOM reports are a lower bound: every report of a process
// that Prometheus scraped after the error must be counted.
func TestOOMPanelsCountEachErrorOnce(t *testing.T) {
	s := requireStack(t)
	ds := loadDashboards(t)
	counters, graphs := oomCountTargets(ds), oomGraphTargets(ds)
	if len(counters) < 3 || len(graphs) < 3 {
		t.Fatalf("found %d out-of-memory count tables and %d graphs, want one of each at least in each of %v", len(counters), len(graphs), wantDashboards)
	}
	ctx := context.Background()

	// Wait until Prometheus has seen an error.
	deadline := s.promStart.Add(dataTimeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		res, err := s.query(ctx, "max(last_over_time(gpumem_allocator_ooms_total[1h])) > 0", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(res) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no out-of-memory error in Prometheus within %s of its start: the simulated mix should raise some\n%s", dataTimeout, s.logs())
		}
		<-tick.C
	}
	// The fleet panels read the recorded counters: wait until the rules
	// have run after the error was scraped (an error can come before their
	// first evaluation, the exporter keeping the counters of processes
	// that exited).
	seen := time.Now()
	for {
		res, err := s.query(ctx, "max(timestamp("+recordedOOMs+"))", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(res) > 0 && len(res[0].samples) > 0 && res[0].samples[0].v >= float64(seen.Unix()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rules did not run within %s of Prometheus's start after it scraped an out-of-memory error\n%s", dataTimeout, s.logs())
		}
		<-tick.C
	}

	end := time.Now().Truncate(time.Millisecond)
	s.waitIngestedAfter(t, ctx, end)
	// Count up to the moment of an evaluation of the workload rules: the
	// panels that read the recorded counters see a process scraped after
	// the last evaluation before their query time only at the next, and
	// the rules' group can take seconds to evaluate.
	res, err := s.query(ctx, "max(timestamp("+recordedOOMs+"))", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(res) == 0 || len(res[0].samples) == 0 {
		t.Fatal("no " + recordedOOMs)
	}
	end = time.UnixMilli(int64(math.Round(res[0].samples[0].v * 1000)))
	full := end.Sub(s.promStart).Truncate(time.Second) + time.Second
	// The recorded counters hold every error of the raw ones: all those
	// scraped up to an evaluation before end, none scraped after end.
	recorded, _, err := s.oomTruthOf(ctx, recordedOOMs, end, full)
	if err != nil {
		t.Fatal(err)
	}
	rawAll, _, err := s.oomTruth(ctx, end, full)
	if err != nil {
		t.Fatal(err)
	}
	rawEarlier, _, err := s.oomTruth(ctx, end.Add(-2*scrapeInterval), full-2*scrapeInterval)
	if err != nil {
		t.Fatal(err)
	}
	if sum(recorded) < sum(rawEarlier) || sum(recorded) > sum(rawAll) {
		t.Errorf("%s holds %v errors since Prometheus started; the raw counters %v until %s before and %v until the end", recordedOOMs, sum(recorded), sum(rawEarlier), 2*scrapeInterval, sum(rawAll))
	}
	for _, window := range []time.Duration{full, full / 2} {
		truths := map[string]map[processKey]float64{}
		for _, metric := range []string{rawOOMs, recordedOOMs} {
			truth, _, err := s.oomTruthOf(ctx, metric, end, window)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range truth {
				if v == 0 {
					delete(truth, k)
				}
			}
			truths[metric] = truth
		}
		for _, c := range counters {
			truth := truths[oomsOf(c.expr)]
			expr, err := s.substitute(c.expr, window, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.query(ctx, expr, end)
			if err != nil {
				t.Fatalf("%s: %v", c.where, err)
			}
			got := map[processKey]float64{}
			perProcess := false
			var total float64
			for _, r := range res {
				v := r.samples[0].v
				total += v
				if pid, ok := r.labels["pid"]; ok {
					perProcess = true
					k := processKey{r.labels["gpu"], pid}
					if _, dup := got[k]; dup {
						t.Errorf("%s, window %s: %s has two rows", c.where, window, k)
					}
					got[k] += v
				}
			}
			if total != sum(truth) {
				t.Errorf("%s, window %s: counts %v errors in all, Prometheus's samples hold %v", c.where, window, total, sum(truth))
			}
			if perProcess {
				for k, want := range truth {
					if got[k] != want {
						t.Errorf("%s, window %s: %s: counted %v errors, the samples hold %v", c.where, window, k, got[k], want)
					}
				}
				for k, v := range got {
					if _, ok := truth[k]; !ok {
						t.Errorf("%s, window %s: %s: counted %v errors, the samples hold none", c.where, window, k, v)
					}
				}
			}
		}
		t.Logf("window %s: %v out-of-memory errors in %d processes in the raw samples (%v recorded), compared with %d panels", window, sum(truths[rawOOMs]), len(truths[rawOOMs]), sum(truths[recordedOOMs]), len(counters))
	}

	// The graphs: bars every graphStep, summed over the run, against the
	// count over (first bar's start, last bar's end].
	first := s.promStart.Truncate(graphStep).Add(graphStep)
	last := end.Truncate(graphStep)
	for _, c := range graphs {
		truth, _, err := s.oomTruthOf(ctx, oomsOf(c.expr), last, last.Sub(first)+graphStep)
		if err != nil {
			t.Fatal(err)
		}
		expr, err := s.substitute(c.expr, full, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.queryRange(ctx, expr, first, last, graphStep)
		if err != nil {
			t.Fatalf("%s: %v", c.where, err)
		}
		var bars float64
		for _, r := range res {
			for _, smp := range r.samples {
				bars += smp.v
			}
		}
		if bars != sum(truth) {
			t.Errorf("%s: its bars from %s to %s add up to %v errors, Prometheus's samples hold %v", c.where, first.Format(time.TimeOnly), last.Format(time.TimeOnly), bars, sum(truth))
		}
	}

	// The exporter's OOM reports: a lower bound per process.
	reports := s.oomReports(t)
	counts, lastSeen, err := s.oomTruth(ctx, end, full)
	if err != nil {
		t.Fatal(err)
	}
	reported := map[processKey]int{}
	for _, r := range reports {
		k := processKey{r.GPU, fmt.Sprint(r.PID)}
		// Scraped after the error: the counter had time to reach the store
		// (one poll) and a scrape.
		if r.Time.After(s.promStart) && r.Time.Before(end) && lastSeen[k] > float64(r.Time.Add(2*scrapeInterval).UnixMilli())/1000 {
			reported[k]++
		}
	}
	keys := make([]processKey, 0, len(reported))
	for k := range reported {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		if counts[k] < float64(reported[k]) {
			t.Errorf("%s: the exporter reported %d out-of-memory errors while Prometheus scraped it, the counter rose by %v", k, reported[k], counts[k])
		}
	}
	t.Logf("%d OOM reports, %d of processes Prometheus scraped after the error", len(reports), len(keys))
}

type oomReport struct {
	Time time.Time `json:"time"`
	GPU  string    `json:"gpu"`
	PID  uint32    `json:"pid"`
}

func (s *stack) oomReports(t *testing.T) []oomReport {
	t.Helper()
	resp, err := http.Get("http://" + s.exporterAddr + "/api/v1/oom-reports")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Reports []oomReport `json:"reports"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("/api/v1/oom-reports: %v", err)
	}
	return body.Reports
}
