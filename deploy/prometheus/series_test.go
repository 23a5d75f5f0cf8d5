package prometheus

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/foresight"
	"github.com/gpumem/gpumem_exporter/internal/doccheck"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// What the lead-time test feeds promtool: a simulated node's series as
// gpumem_exporter exposes them (docs/metrics.md) and a Prometheus scrapes
// them, every scrapeInterval, with instance and job added.
const (
	scrapeInterval = 15 * time.Second
	instance       = "node-a:9481"
	scrapeJob      = "gpumem"
)

// gpuUUID is the UUID of a simulated GPU.
func gpuUUID(gpu int) string { return fmt.Sprintf("GPU-5f0e3c1a-7b2d-4e89-a1c3-%012d", gpu) }

// node is the simulated node's name, as the exporter names it in the
// workload of a process outside pods and Slurm jobs.
const node = "node-a"

// workloadOf is the workload label the exporter gives a process: its pod,
// else its Slurm job, else the process itself on its node.
func workloadOf(id scenario.Identity, pid int) string {
	switch {
	case id.Pod != "":
		return id.Namespace + "/" + id.Pod
	case id.SlurmJobID != "":
		return "slurm job " + id.SlurmJobID
	default:
		return fmt.Sprintf("%s pid %d", node, pid)
	}
}

// series holds one series' samples, one per scrape from first on; NaN
// where the series was absent.
type series struct {
	first int
	vals  []float64
}

// seriesSet collects the series of successive scrapes.
type seriesSet struct {
	scrapes int
	byKey   map[string]*series
}

func newSeriesSet() *seriesSet { return &seriesSet{byKey: map[string]*series{}} }

// scrape records one scrape: the value of every series present.
func (s *seriesSet) scrape(samples map[string]float64) {
	i := s.scrapes
	s.scrapes++
	for key, v := range samples {
		ser := s.byKey[key]
		if ser == nil {
			ser = &series{first: i}
			s.byKey[key] = ser
		}
		for len(ser.vals) < i-ser.first {
			ser.vals = append(ser.vals, math.NaN()) // absent meanwhile
		}
		ser.vals = append(ser.vals, v)
	}
}

// values writes a series in promtool's expanding notation: "_" before it
// appeared, "stale" when it went (Prometheus writes a staleness marker on
// the first scrape that lacks it), runs of one value as "vxN".
func (s *seriesSet) values(ser *series) string {
	var b strings.Builder
	item := func(v string, n int) { // n repeats of v
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		switch {
		case v == "_":
			fmt.Fprintf(&b, "_x%d", n)
		case n == 1:
			b.WriteString(v)
		default:
			fmt.Fprintf(&b, "%sx%d", v, n-1)
		}
	}
	if ser.first > 0 {
		item("_", ser.first)
	}
	vals := append([]float64(nil), ser.vals...)
	for len(vals) < s.scrapes-ser.first {
		vals = append(vals, math.NaN())
	}
	tokens := make([]string, len(vals))
	for i, v := range vals {
		switch {
		case !math.IsNaN(v):
			tokens[i] = strconv.FormatFloat(v, 'f', -1, 64)
		case i > 0 && !math.IsNaN(vals[i-1]):
			tokens[i] = "stale"
		default:
			tokens[i] = "_"
		}
	}
	for i := 0; i < len(tokens); {
		j := i + 1
		for j < len(tokens) && tokens[j] == tokens[i] && tokens[i] != "stale" {
			j++
		}
		item(tokens[i], j-i)
		i = j
	}
	return b.String()
}

// labelBody formats a label set as in a series selector, {k="v",...},
// leaving out empty labels as Prometheus does.
func labelBody(labels ...string) string {
	var b strings.Builder
	b.WriteByte('{')
	sep := ""
	for i := 0; i+1 < len(labels); i += 2 {
		if labels[i+1] == "" {
			continue
		}
		fmt.Fprintf(&b, "%s%s=%q", sep, labels[i], labels[i+1])
		sep = ","
	}
	b.WriteByte('}')
	return b.String()
}

// truth is what really happened on the simulated node, and the warnings
// the daemon sent its processes.
type truth struct {
	ooms     []scenario.OOM
	procs    map[int]*procLife
	warnings []warning
	end      time.Duration
}

// warning is one warning message the daemon sent a process over its
// socket, foreseeing an OOM in eta.
type warning struct {
	at       time.Duration
	pid      int
	workload string
	eta      time.Duration
	fc       diagnosis.Forecast
}

// procLife is one process from start to exit.
type procLife struct {
	scenario.Process // first state seen
	workload         string
	exited           time.Duration // 0 while alive at the end
}

// pollInterval is how often the exporter polls NVML and, in the simulated
// node, how often each process reports its allocator state: about once a
// second, as the Python client does.
const pollInterval = time.Second

// simulate runs scenario name with seed for d, polling every pollInterval,
// and returns the series of every scrape and what happened.
func simulate(name string, seed uint64, d time.Duration) (*seriesSet, *truth, error) {
	n, err := scenario.New(name, seed)
	if err != nil {
		return nil, nil, err
	}
	set := newSeriesSet()
	tr := &truth{procs: map[int]*procLife{}, end: d}
	exp := newExporter()
	// poll reads the node as the exporter does: its poller's peak of used
	// (the allocator's peak reserved plus context), the floor of active
	// that the store keeps from each report (stamped with the simulated
	// clock), the foresight's time to OOM and its warnings, and the
	// processes that exited, kept for the OOM linger.
	epoch := time.Unix(1_700_000_000, 0)
	poll := func(dt time.Duration) scenario.Tick {
		tk := n.Advance(dt)
		tr.warnings = append(tr.warnings, exp.foresee(tk, epoch.Add(tk.Elapsed))...)
		for _, p := range tk.Processes {
			exp.peakUsed[p.PID] = max(exp.peakUsed[p.PID], p.Context+p.PeakReserved)
			if p.ReportsAllocator {
				f := exp.floors[p.PID]
				if f == nil {
					f = &allocstats.ActiveFloor{}
					exp.floors[p.PID] = f
				}
				f.Observe(epoch.Add(tk.Elapsed), p.Active)
			}
			if tr.procs[p.PID] == nil {
				tr.procs[p.PID] = &procLife{Process: p, workload: workloadOf(p.Identity, p.PID)}
			}
		}
		for _, p := range tk.Exited {
			if l := tr.procs[p.PID]; l != nil {
				l.exited = tk.Elapsed
			}
			delete(exp.peakUsed, p.PID)
			delete(exp.floors, p.PID)
			exp.forget(p)
			if p.ReportsAllocator && exp.linger > 0 {
				exp.gone = append(exp.gone, goneProc{p, tk.Elapsed})
			}
		}
		kept := exp.gone[:0]
		for _, g := range exp.gone {
			if tk.Elapsed-g.at < exp.linger {
				kept = append(kept, g)
			}
		}
		exp.gone = kept
		tr.ooms = append(tr.ooms, tk.OOMs...)
		return tk
	}
	set.scrape(exp.scrape(poll(0)))
	for at := scrapeInterval; at <= d; at += scrapeInterval {
		var tk scenario.Tick
		for t := time.Duration(0); t < scrapeInterval; t += pollInterval {
			tk = poll(pollInterval)
		}
		set.scrape(exp.scrape(tk))
	}
	return set, tr, nil
}

// goneProc is a process that exited at at, in its last state.
type goneProc struct {
	scenario.Process
	at time.Duration
}

// exporter turns a node's state into the series a scrape of
// gpumem_exporter gets, by selector. It keeps each process's and GPU's
// labels, which do not change.
type exporter struct {
	gpu, gpuInfo   map[int]string
	proc, procInfo map[int]string
	peakUsed       map[int]uint64
	floors         map[int]*allocstats.ActiveFloor
	// tracker, timeToOOM, schedule and ooms are the foresight's: each
	// process's active memory and forecast, the estimate of the last poll
	// (while one is measured), when the process is warned, and its OOM
	// counter at the last poll.
	tracker   *foresight.Tracker
	timeToOOM map[int]time.Duration
	schedule  *foresight.Schedule
	ooms      map[int]uint64
	// linger is --allocstats.oom-linger; gone holds the processes that
	// exited within it, whose counters and process_info are still
	// exported.
	linger time.Duration
	gone   []goneProc
}

func newExporter() *exporter {
	return &exporter{gpu: map[int]string{}, gpuInfo: map[int]string{}, proc: map[int]string{}, procInfo: map[int]string{},
		peakUsed: map[int]uint64{}, floors: map[int]*allocstats.ActiveFloor{}, linger: allocstats.DefaultOOMLinger,
		tracker: foresight.NewTracker(), timeToOOM: map[int]time.Duration{}, schedule: foresight.NewSchedule(), ooms: map[int]uint64{}}
}

// foreKey is the foresight's key of process p.
func foreKey(p scenario.Process) diagnosis.Key {
	return diagnosis.Key{PID: uint32(p.PID), Start: uint64(p.Started / time.Second), UUID: gpuUUID(p.GPU)}
}

// capacity is what p's allocator can hold at most (the exporter's
// gpumem_allocator_capacity_bytes): its limit, or what it holds plus the
// GPU's free memory; and whether that is the limit.
func capacity(p scenario.Process, free uint64) (uint64, bool) {
	c := p.Reserved + free
	if p.Limit > 0 && p.Limit <= c {
		return p.Limit, true
	}
	return c, false
}

// foresee does what the daemon's foresight does at each poll: it notes
// each reporting process's active memory at the poll's time, measures its
// climb, keeps the time to OOM for the scrape, and returns the warnings
// the daemon sends (at its default threshold).
func (e *exporter) foresee(tk scenario.Tick, at time.Time) []warning {
	free := map[int]uint64{}
	for _, g := range tk.GPUs {
		free[g.Index] = g.Free
	}
	var sent []warning
	for _, p := range tk.Processes {
		if !p.ReportsAllocator {
			continue
		}
		k := foreKey(p)
		if p.OOMs > e.ooms[p.PID] {
			e.ooms[p.PID] = p.OOMs
			e.schedule.Failed(k, at)
		}
		e.tracker.Note(k, at, p.Active)
		ceiling, isLimit := capacity(p, free[p.GPU])
		fc, ok := e.tracker.Forecast(k, at, ceiling, isLimit)
		if !ok {
			delete(e.timeToOOM, p.PID)
			continue
		}
		e.timeToOOM[p.PID] = fc.ETA
		if e.schedule.Warn(k, fc, foresight.DefaultWarnBefore) {
			sent = append(sent, warning{at: tk.Elapsed, pid: p.PID, workload: workloadOf(p.Identity, p.PID), eta: fc.ETA, fc: fc})
		}
	}
	return sent
}

// forget drops the foresight's state of p, which exited.
func (e *exporter) forget(p scenario.Process) {
	k := foreKey(p)
	e.tracker.Forget(k)
	e.schedule.Forget(k)
	delete(e.timeToOOM, p.PID)
	delete(e.ooms, p.PID)
}

func (e *exporter) gpuLabels(g int) (labels, info string) {
	if _, ok := e.gpu[g]; !ok {
		gl := []string{"instance", instance, "job", scrapeJob, "gpu", strconv.Itoa(g), "uuid", gpuUUID(g)}
		e.gpu[g] = labelBody(gl...)
		e.gpuInfo[g] = labelBody(append(gl, "name", "NVIDIA H200", "pci_bus_id", fmt.Sprintf("00000000:%02X:00.0", 0x18+g),
			"driver_version", "580.159.04", "cuda_driver_version", "13.0", "mig_mode", "disabled")...)
	}
	return e.gpu[g], e.gpuInfo[g]
}

func (e *exporter) procLabels(p scenario.Process) (labels, info string) {
	if _, ok := e.proc[p.PID]; !ok {
		pl := []string{"instance", instance, "job", scrapeJob, "gpu", strconv.Itoa(p.GPU), "uuid", gpuUUID(p.GPU),
			"pid", strconv.Itoa(p.PID), "comm", p.Comm, "namespace", p.Namespace, "pod", p.Pod, "container", p.Container,
			"workload", workloadOf(p.Identity, p.PID)}
		framework := ""
		if p.ReportsAllocator {
			framework = "pytorch"
		}
		e.proc[p.PID] = labelBody(pl...)
		e.procInfo[p.PID] = labelBody(append(pl, "container_id", containerID(p), "pod_uid", podUID(p),
			"slurm_job_id", p.SlurmJobID, "uid", "1000", "framework", framework)...)
	}
	return e.proc[p.PID], e.procInfo[p.PID]
}

// scrape returns the series a scrape gets from the node's state tk.
func (e *exporter) scrape(tk scenario.Tick) map[string]float64 {
	peakUsed := e.peakUsed
	m := map[string]float64{}
	m["gpumem_nvml_up"+labelBody("instance", instance, "job", scrapeJob)] = 1
	free := map[int]uint64{}
	for _, g := range tk.GPUs {
		free[g.Index] = g.Free
		gl, info := e.gpuLabels(g.Index)
		m["gpumem_gpu_info"+info] = 1
		m["gpumem_gpu_memory_total_bytes"+gl] = float64(g.Total)
		m["gpumem_gpu_memory_used_bytes"+gl] = float64(g.Used)
		m["gpumem_gpu_memory_free_bytes"+gl] = float64(g.Free)
		m["gpumem_gpu_memory_reserved_bytes"+gl] = float64(g.DriverReserved)
		m["gpumem_gpu_memory_unattributed_bytes"+gl] = float64(g.Unattributed)
		m["gpumem_gpu_processes"+gl] = float64(g.Processes)
	}
	for _, p := range tk.Processes {
		pl, info := e.procLabels(p)
		put := func(name string, v uint64) { m[name+pl] = float64(v) }
		put("gpumem_process_memory_used_bytes", p.Used())
		put("gpumem_process_memory_peak_bytes", max(peakUsed[p.PID], p.Used()))
		m["gpumem_process_info"+info] = 1
		if !p.ReportsAllocator {
			continue
		}
		put("gpumem_process_context_bytes", p.Context)
		put("gpumem_allocator_reserved_bytes", p.Reserved)
		put("gpumem_allocator_active_bytes", p.Active)
		put("gpumem_allocator_inactive_bytes", p.Inactive())
		put("gpumem_allocator_allocated_bytes", p.Allocated)
		put("gpumem_allocator_inactive_split_bytes", p.InactiveSplit)
		put("gpumem_allocator_peak_reserved_bytes", p.PeakReserved)
		put("gpumem_allocator_peak_active_bytes", p.PeakActive)
		if p.Limit > 0 {
			put("gpumem_allocator_limit_bytes", p.Limit)
		}
		ceiling, _ := capacity(p, free[p.GPU])
		put("gpumem_allocator_capacity_bytes", ceiling)
		if eta, ok := e.timeToOOM[p.PID]; ok {
			put("gpumem_allocator_time_to_oom_seconds", uint64(eta.Seconds()))
		}
		if f := e.floors[p.PID]; f != nil {
			if v, ok := f.Floor(); ok {
				put("gpumem_allocator_active_floor_bytes", v)
			}
		}
		e.counters(m, pl, p, tk.Elapsed)
	}
	// Processes that exited within the linger: their counters, last OOM
	// and process_info, not their memory.
	for _, g := range e.gone {
		pl, info := e.procLabels(g.Process)
		m["gpumem_process_info"+info] = 1
		e.counters(m, pl, g.Process, g.at)
	}
	return m
}

// counters puts the allocator counters and last OOM of p, which last
// reported at reported.
func (e *exporter) counters(m map[string]float64, pl string, p scenario.Process, reported time.Duration) {
	put := func(name string, v uint64) { m[name+pl] = float64(v) }
	put("gpumem_allocator_alloc_retries_total", p.AllocRetries)
	put("gpumem_allocator_ooms_total", p.OOMs)
	if p.OOMs > 0 {
		put("gpumem_allocator_last_oom_request_bytes", p.LastOOMRequest)
		m["gpumem_allocator_last_oom_timestamp_seconds"+pl] = p.LastOOMAt.Seconds()
	}
	m["gpumem_allocator_last_report_timestamp_seconds"+pl] = math.Floor(reported.Seconds())
}

func containerID(p scenario.Process) string {
	if p.Pod == "" {
		return ""
	}
	return fmt.Sprintf("%064x", p.PID)
}

func podUID(p scenario.Process) string {
	if p.Pod == "" {
		return ""
	}
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", len(p.Pod), len(p.Namespace))
}

// promqlName matches what may be a metric name in a PromQL expression; it
// also matches function and label names, which only keeps more than needed.
var promqlName = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)

// rulesForAlerts writes to dir the rules of rules.yml that the named alerts
// need: the alerts themselves and, transitively, the recording rules their
// expressions read, in their groups and order, without annotations (they
// take no part in when an alert fires; expanding their queries at every
// evaluation would only slow promtool down). The other rules cannot change
// when these fire, and evaluating them is most of promtool's time. It
// returns the file's path and the metric names the kept rules read, for
// writeTestFile to feed only those series.
func rulesForAlerts(dir string, alerts []string) (string, map[string]bool, error) {
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		return "", nil, err
	}
	var doc struct {
		Groups []map[string]any `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", nil, fmt.Errorf("parsing %s: %w", rulesFile, err)
	}
	recorded := map[string]string{} // recorded name -> its expression
	for _, g := range doc.Groups {
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			if rule, ok := r.(map[string]any); ok {
				if rec, ok := rule["record"].(string); ok {
					recorded[rec], _ = rule["expr"].(string)
				}
			}
		}
	}
	wanted := map[string]bool{}
	for _, a := range alerts {
		wanted[a] = true
	}
	// reads: every name the kept rules read, recording rules included.
	reads := map[string]bool{}
	var visit func(expr string)
	visit = func(expr string) {
		if strings.Contains(expr, "__name__") {
			reads["__name__"] = true // a selector by regex: keep every series
		}
		for _, n := range promqlName.FindAllString(expr, -1) {
			if reads[n] {
				continue
			}
			reads[n] = true
			if e, ok := recorded[n]; ok {
				visit(e)
			}
		}
	}
	for _, g := range doc.Groups {
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			if rule, ok := r.(map[string]any); ok {
				if name, ok := rule["alert"].(string); ok && wanted[name] {
					e, _ := rule["expr"].(string)
					visit(e)
				}
			}
		}
	}
	kept := 0
	for _, g := range doc.Groups {
		rules, _ := g["rules"].([]any)
		var keep []any
		for _, r := range rules {
			rule, ok := r.(map[string]any)
			if !ok {
				continue
			}
			alert, _ := rule["alert"].(string)
			rec, _ := rule["record"].(string)
			if wanted[alert] || reads[rec] && rec != "" {
				delete(rule, "annotations")
				keep = append(keep, rule)
				if alert != "" {
					kept++
				}
			}
		}
		g["rules"] = keep
	}
	if kept != len(alerts) {
		return "", nil, fmt.Errorf("%s: %d of the alerts %v found", rulesFile, kept, alerts)
	}
	var groups []map[string]any
	for _, g := range doc.Groups {
		if rules, _ := g["rules"].([]any); len(rules) > 0 {
			groups = append(groups, g)
		}
	}
	doc.Groups = groups
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", nil, err
	}
	if reads["__name__"] {
		reads = nil // every series
	}
	path := dir + "/rules.yml"
	return path, reads, os.WriteFile(path, out, 0o644)
}

// writeTestFile writes a promtool unit test file that feeds set to the
// rules at rulesPath and asks, at every evaluation, for no alert of each
// name: promtool then lists every alert that fires, as a failure. With
// names not nil, only the series of those metric names are fed.
func writeTestFile(path, rulesPath string, set *seriesSet, names map[string]bool, alerts []string, evalEvery time.Duration) error {
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files:\n  - %s\nevaluation_interval: %s\ntests:\n  - interval: %s\n    input_series:\n",
		rulesPath, model.Duration(evalEvery), model.Duration(scrapeInterval))
	keys := make([]string, 0, len(set.byKey))
	for k := range set.byKey {
		if names != nil && !names[metricName(k)] {
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "      - series: '%s'\n        values: '%s'\n", k, set.values(set.byKey[k]))
	}
	b.WriteString("    alert_rule_test:\n")
	end := time.Duration(set.scrapes-1) * scrapeInterval
	for at := evalEvery; at <= end; at += evalEvery {
		for _, a := range alerts {
			fmt.Fprintf(&b, "      - eval_time: %s\n        alertname: %s\n        exp_alerts: []\n", model.Duration(at), a)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// firing is one alert firing at one evaluation.
type firing struct {
	alert  string
	at     time.Duration
	labels map[string]string
}

var (
	failureHeader = regexp.MustCompile(`^\s*alertname: (\S+), time: (\S+),\s*$`)
	labelsLine    = regexp.MustCompile(`^\s*Labels:\{(.*)\}\s*$`)
	labelPair     = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
)

// promtoolFirings runs promtool on the test file and returns every firing it
// reports. Failures other than alerts that fire are errors.
func promtoolFirings(promtool, testFile string) ([]firing, error) {
	cmd := exec.Command(promtool, "test", "rules", testFile)
	// One thread and a lazier GC: promtool's CPU is what the lead-time test
	// costs, and these cut it by about 15% (the files run in parallel).
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "GOGC=400")
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err == nil {
		return nil, nil // no alert fired at all
	}
	if !strings.Contains(text, "FAILED:") || strings.Contains(text, "err:") || strings.Contains(strings.ToLower(text), "error") {
		// Not (only) alerts that fired: a syntax or evaluation error.
		return nil, fmt.Errorf("promtool test rules %s: %v\n%s", testFile, err, head(text, 3000))
	}
	var (
		fs  []firing
		cur *firing
	)
	for _, line := range strings.Split(text, "\n") {
		if m := failureHeader.FindStringSubmatch(line); m != nil {
			at, perr := model.ParseDuration(m[2])
			if perr != nil {
				return nil, fmt.Errorf("promtool's output: time %q: %w", m[2], perr)
			}
			cur = &firing{alert: m[1], at: time.Duration(at)}
			continue
		}
		if m := labelsLine.FindStringSubmatch(line); m != nil && cur != nil {
			f := firing{alert: cur.alert, at: cur.at, labels: map[string]string{}}
			for _, p := range labelPair.FindAllStringSubmatch(m[1], -1) {
				v, uerr := strconv.Unquote(`"` + p[2] + `"`)
				if uerr != nil {
					v = p[2]
				}
				f.labels[p[1]] = v
			}
			fs = append(fs, f)
		}
	}
	return fs, nil
}

func head(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func TestSeriesValuesInPromtoolNotation(t *testing.T) {
	t.Parallel()
	set := newSeriesSet()
	for _, scrape := range []map[string]float64{
		{"a": 1},
		{"a": 1, "b": 5},
		{"a": 1, "b": 5},
		{"a": 2, "b": 7},
		{"a": 2},
		{"a": 2},
		{"a": 2, "b": 9}, // back after a gap: a new stretch
	} {
		set.scrape(scrape)
	}
	for key, want := range map[string]string{
		"a": "1x2 2x3",
		"b": "_x1 5x1 7 stale _x1 9",
	} {
		if got := set.values(set.byKey[key]); got != want {
			t.Errorf("values of %s = %q, want %q", key, got, want)
		}
	}
	gone := newSeriesSet()
	gone.scrape(map[string]float64{"c": 3})
	gone.scrape(map[string]float64{})
	gone.scrape(map[string]float64{})
	if got, want := gone.values(gone.byKey["c"]), "3 stale _x1"; got != want {
		t.Errorf("values of a series that went = %q, want %q", got, want)
	}
}

func TestExpositionUsesDocumentedMetrics(t *testing.T) {
	t.Parallel()
	set, tr, err := simulate(scenario.Mix, 1, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var names strings.Builder
	for key := range set.byKey {
		names.WriteString(key[:strings.IndexByte(key, '{')] + "\n")
	}
	if missing := undocumented(names.String(), documentedMetrics(t)); len(missing) > 0 {
		t.Errorf("the lead-time test writes metrics that %s does not document: %s", metricsDoc, strings.Join(missing, ", "))
	}
	for _, want := range []string{"gpumem_allocator_peak_active_bytes", "gpumem_process_info", "gpumem_gpu_memory_free_bytes", "gpumem_allocator_limit_bytes"} {
		if !strings.Contains(names.String(), want+"\n") {
			t.Errorf("the mix's series lack %s", want)
		}
	}
	if len(tr.procs) < 10 {
		t.Errorf("%d processes in 10 minutes of the mix", len(tr.procs))
	}
}

func TestPromtoolFiringsReadsPromtoolsFailures(t *testing.T) {
	t.Parallel()
	promtool := doccheck.Promtool(t)
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yml")
	if err := os.WriteFile(rules, []byte(`groups:
  - name: g
    rules:
      - alert: High
        expr: x > 1
        labels: {severity: warning}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	set := newSeriesSet()
	for _, v := range []float64{0, 2, 2, 0, 0, 3} {
		set.scrape(map[string]float64{`x{workload="ml/a b"}`: v})
	}
	file := filepath.Join(dir, "test.yml")
	if err := writeTestFile(file, rules, set, nil, []string{"High"}, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	fs, err := promtoolFirings(promtool, file)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fs {
		got = append(got, fmt.Sprintf("%s@%v:%s", f.alert, f.at, f.labels["workload"]))
	}
	want := []string{"High@15s:ml/a b", "High@30s:ml/a b", "High@1m15s:ml/a b"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("firings = %v, want %v", got, want)
	}
	eps := episodes(fs, alertKey)
	if len(eps) != 2 || eps[0].onset != 15*time.Second || eps[0].end != 30*time.Second || eps[1].onset != 75*time.Second {
		t.Errorf("episodes = %+v, want 15s-30s and 1m15s", eps)
	}
}

// metricName is the metric name of a series key, name{labels}.
func metricName(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		return key[:i]
	}
	return key
}
