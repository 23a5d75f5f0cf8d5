package collector

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/internal/mocknode"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/workload"
)

// update rewrites the golden files from the gathered output. Read the diff
// before committing it: a golden file is a specification.
var update = flag.Bool("update", false, "rewrite collector/testdata/*.prom from the gathered output")

const (
	MiB = mocknode.MiB
	GiB = mocknode.GiB
)

// t0 is the fixed report time of the allocator feed, so that the timestamp
// series are stable.
var t0 = time.Unix(1_750_000_000, 0)

// durationMetrics vary from run to run and are left out of golden files.
var durationMetrics = map[string]bool{
	"gpumem_scrape_collector_duration_seconds": true,
	"gpumem_nvml_poll_duration_seconds":        true,
}

var (
	gpuUUID = mocknode.GPUUUID
	migUUID = mocknode.MIGUUID
	memV2   = mocknode.MemV2
	proc    = mocknode.Proc
)

type mockNode = mocknode.Node

// fakeResolver names processes from a fixed map (an attribution.Lookup).
type fakeResolver map[uint32]workload.Info

func (r fakeResolver) Lookup(pid uint32) (workload.Info, bool) {
	in, ok := r[pid]
	if ok {
		in.PID = pid
	}
	return in, ok
}

// fullReport is an allocator report with every optional field.
func fullReport(uuid string, reserved, active uint64) allocstats.DeviceReport {
	return allocstats.DeviceReport{
		UUID:          uuid,
		Reserved:      reserved,
		Active:        allocstats.Some(active),
		Allocated:     allocstats.Some(active - 256*MiB),
		InactiveSplit: allocstats.Some(512 * MiB),
		PeakReserved:  allocstats.Some(reserved + 1*GiB),
		PeakActive:    allocstats.Some(active + 2*GiB),
		Limit:         allocstats.Some(40 * GiB),
		AllocRetries:  allocstats.Some(3),
		OOMs:          allocstats.Some(1),
	}
}

// newPoller polls lib once and fails the test if the poll fails.
func newPoller(t testing.TB, lib gonvml.Interface) *nvmlpoll.Poller {
	t.Helper()
	p := nvmlpoll.NewPoller(nvmlpoll.Config{Lib: lib})
	if err := p.Poll(); err != nil {
		t.Fatalf("polling the mock node: %v", err)
	}
	return p
}

// sources wires a poller, a store and a resolver as main does.
func sources(p *nvmlpoll.Poller, store *allocstats.Store, r attribution.Lookup) Sources {
	src := Sources{Join: attribution.Sources{NVML: p}, NVMLHealth: p}
	if store != nil {
		src.Join.Allocator = store
	}
	if r != nil {
		src.Join.Workload = r
	}
	return src
}

// newRegistry registers an exporter of the named collectors (every
// registered one when none: Enabled() is empty until kingpin parses the
// flags, see TestEnabledIsTheDefaultsBeforeFlagsAreParsed). The exporter's Describe sends only the scrape_collector_*
// descriptors, so a pedantic registry would reject every other series as
// unregistered (TestPedanticRegistryRejectsTheUncheckedExporter): a plain
// registry is used.
func newRegistry(t testing.TB, src Sources, names ...string) *prometheus.Registry {
	t.Helper()
	if len(names) == 0 {
		names = Names()
	}
	exp, err := New(src, log.NewNopLogger(), names...)
	if err != nil {
		t.Fatalf("New(%v): %v", names, err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(exp); err != nil {
		t.Fatalf("registering the exporter: %v", err)
	}
	exportersMu.Lock()
	exporters[reg] = exp
	exportersMu.Unlock()
	return reg
}

// exporters maps the registries newRegistry made to their exporter, so
// that compareGolden can check the text path too.
var (
	exportersMu sync.Mutex
	exporters   = map[prometheus.Gatherer]*Exporter{}
)

// textOf encodes the families of a gather, duration metrics aside, as
// expfmt writes them.
func textOf(t testing.TB, mfs []*dto.MetricFamily) string {
	t.Helper()
	var buf bytes.Buffer
	for _, mf := range mfs {
		if durationMetrics[mf.GetName()] {
			continue
		}
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			t.Fatalf("encoding %s: %v", mf.GetName(), err)
		}
	}
	return buf.String()
}

// gatherText is what GatherText writes, duration metrics aside.
func gatherText(t testing.TB, exp *Exporter) string {
	t.Helper()
	fams, err := exp.GatherText()
	if err != nil {
		t.Fatalf("GatherText: %v", err)
	}
	var b strings.Builder
	for i, f := range fams {
		if i > 0 && fams[i-1].Name >= f.Name {
			t.Fatalf("GatherText: %s after %s: not sorted by name, or twice", f.Name, fams[i-1].Name)
		}
		if !durationMetrics[f.Name] {
			b.Write(f.Text)
		}
	}
	return b.String()
}

// compareText checks that the exporter's text path writes, byte for
// byte, what client_golang gathers and expfmt encodes from reg: once
// rendered, and once from its cache.
func compareText(t *testing.T, exp *Exporter, reg prometheus.Gatherer) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	want := textOf(t, mfs)
	for _, pass := range []string{"rendered", "cached"} {
		if got := gatherText(t, exp); got != want {
			t.Errorf("the text path (%s) differs from client_golang's:\n%s", pass, lineDiff(want, got))
		}
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, "- "+l)
		case n < 0:
			out = append(out, "+ "+l)
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		return "(same lines, in another order)"
	}
	return strings.Join(out, "\n")
}

// compareGolden compares everything reg gathers, duration metrics aside,
// with testdata/<name>.prom: a family in either and not the other fails.
func compareGolden(t *testing.T, reg prometheus.Gatherer, name string) {
	t.Helper()
	exportersMu.Lock()
	exp := exporters[reg]
	exportersMu.Unlock()
	if exp != nil {
		compareText(t, exp, reg)
	}
	path := filepath.Join("testdata", name+".prom")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	if *update {
		var buf bytes.Buffer
		for _, mf := range mfs {
			if durationMetrics[mf.GetName()] {
				continue
			}
			if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
				t.Fatalf("encoding %s: %v", mf.GetName(), err)
			}
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the golden file: %v", err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	sc := bufio.NewScanner(bytes.NewReader(want))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
		}
	}
	var list []string
	for n := range names {
		if !durationMetrics[n] {
			list = append(list, n)
		}
	}
	sort.Strings(list)
	if err := testutil.GatherAndCompare(reg, bytes.NewReader(want), list...); err != nil {
		t.Errorf("gathered metrics differ from %s (after checking the change, -update rewrites it):\n%v", path, err)
	}
}

// sample is one gathered series.
type sample struct {
	name   string
	typ    dto.MetricType
	labels map[string]string
	value  float64
}

func gather(t testing.TB, g prometheus.Gatherer) []sample {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var out []sample
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := sample{name: mf.GetName(), typ: mf.GetType(), labels: map[string]string{}}
			for _, lp := range m.GetLabel() {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				s.value = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				s.value = m.GetCounter().GetValue()
			case dto.MetricType_UNTYPED:
				s.value = m.GetUntyped().GetValue()
			}
			out = append(out, s)
		}
	}
	return out
}

// find returns the series named name whose labels include match (given as
// name, value pairs).
func find(samples []sample, name string, match ...string) []sample {
	var out []sample
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(match); i += 2 {
			if s.labels[match[i]] != match[i+1] {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// one returns the value of the single series that find returns, failing
// the test when there is not exactly one.
func one(t testing.TB, samples []sample, name string, match ...string) float64 {
	t.Helper()
	got := find(samples, name, match...)
	if len(got) != 1 {
		t.Fatalf("%s%v: %d series, want exactly 1", name, match, len(got))
	}
	return got[0].value
}

// mustReport hands the store a stats message of pid (start time 1) as a
// client would send it.
func mustReport(store *allocstats.Store, pid uint32, framework string, reports []allocstats.DeviceReport, now time.Time) {
	if err := allocstatstest.Report(store, allocstats.Identity{PID: pid, StartTime: 1}, framework, reports, now); err != nil {
		panic(err)
	}
}

// mustReportOOM hands the store an oom message of pid.
func mustReportOOM(store *allocstats.Store, pid uint32, uuid string, requested uint64, now time.Time) {
	if _, err := allocstatstest.OOM(store, allocstats.Identity{PID: pid, StartTime: 1}, allocstats.OOMMessage{UUID: uuid, RequestedBytes: requested}, now); err != nil {
		panic(err)
	}
}
