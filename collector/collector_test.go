package collector

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

func TestNVMLAbsentAtStartThenPresent(t *testing.T) {
	node := twoGPUNode()
	var present atomic.Bool
	node.InitFunc = func() gonvml.Return {
		if present.Load() {
			return gonvml.SUCCESS
		}
		return gonvml.ERROR_LIBRARY_NOT_FOUND
	}
	p := nvmlpoll.NewPoller(nvmlpoll.Config{Lib: node})
	reg := newRegistry(t, sources(p, allocstats.NewStore(0), nil))

	if err := p.Poll(); err == nil {
		t.Fatal("Poll succeeded without an NVML library")
	}
	compareGolden(t, reg, "nvml_absent")
	s := gather(t, reg)
	if got := one(t, s, "gpumem_nvml_up"); got != 0 {
		t.Errorf("nvml_up without NVML = %v, want 0", got)
	}
	if got := one(t, s, "gpumem_nvml_errors_total", "call", "Init"); got != 1 {
		t.Errorf("errors{call=Init} = %v, want 1", got)
	}
	for _, x := range s {
		if strings.HasPrefix(x.name, "gpumem_gpu_") || strings.HasPrefix(x.name, "gpumem_process_") {
			t.Errorf("%s%v exported without NVML", x.name, x.labels)
		}
	}

	present.Store(true)
	if err := p.Poll(); err != nil {
		t.Fatalf("Poll once NVML is present: %v", err)
	}
	compareGolden(t, reg, "nvml_present_after_absent")
	s = gather(t, reg)
	if got := one(t, s, "gpumem_nvml_up"); got != 1 {
		t.Errorf("nvml_up once NVML is present = %v, want 1", got)
	}
	if n := len(find(s, "gpumem_gpu_memory_used_bytes")); n != 2 {
		t.Errorf("used series once NVML is present: %d, want 2", n)
	}
}

// As in node_exporter: a collector whose source has not delivered yet
// (no NVML poll) did not succeed, and says so with success 0; one whose
// source is absent (no Kubernetes) is not built at all.
func TestNoDataReportsSuccessZero(t *testing.T) {
	p := nvmlpoll.NewPoller(nvmlpoll.Config{Lib: twoGPUNode()})
	reg := newRegistry(t, Sources{Join: attribution.Sources{NVML: p, Allocator: allocstats.NewStore(0)}, NVMLHealth: p})
	s := gather(t, reg)
	for name, want := range map[string]float64{"gpu": 0, "process": 0, "allocator": 0, "nvml": 1} {
		if got := one(t, s, "gpumem_scrape_collector_success", "collector", name); got != want {
			t.Errorf("scrape_collector_success{collector=%q} before the first poll = %v, want %v", name, got, want)
		}
		one(t, s, "gpumem_scrape_collector_duration_seconds", "collector", name)
	}
	for _, name := range []string{"allocstats", "kubernetes"} {
		if n := len(find(s, "gpumem_scrape_collector_success", "collector", name)); n != 0 {
			t.Errorf("collector %s without its source exported %d success series, want none", name, n)
		}
	}

	if err := p.Poll(); err != nil {
		t.Fatal(err)
	}
	s = gather(t, reg)
	for _, name := range []string{"gpu", "process", "allocator", "nvml"} {
		if got := one(t, s, "gpumem_scrape_collector_success", "collector", name); got != 1 {
			t.Errorf("scrape_collector_success{collector=%q} after a poll of an idle node = %v, want 1 (nothing running is not a failure)", name, got)
		}
	}
}

type failingCollector struct{}

func (failingCollector) Update(*Scrape, chan<- prometheus.Metric) error {
	return errors.New("the source broke")
}

func TestFailedCollectorReportsSuccessZero(t *testing.T) {
	e := &Exporter{collectors: map[string]Collector{"broken": failingCollector{}}, logger: log.NewNopLogger()}
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	if got := one(t, gather(t, reg), "gpumem_scrape_collector_success", "collector", "broken"); got != 0 {
		t.Errorf("scrape_collector_success of a failing collector = %v, want 0", got)
	}
}

func TestNewRejectsAnUnknownCollector(t *testing.T) {
	_, err := New(Sources{}, log.NewNopLogger(), "gpu", "no_such_collector")
	if err == nil || !strings.Contains(err.Error(), "no_such_collector") {
		t.Errorf("New with an unknown collector: err = %v, want one naming it", err)
	}
}

func TestEveryCollectorIsRegistered(t *testing.T) {
	want := []string{"allocator", "allocstats", "gpu", "kubernetes", "nvml", "process"}
	if got := Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Names() = %v, want %v", got, want)
	}
}

// Enabled's doc: "the collectors enabled by flags (or by default when the
// flags were not parsed)". Every collector is enabled by default, and a
// test binary never parses kingpin's flags.
func TestEnabledIsTheDefaultsBeforeFlagsAreParsed(t *testing.T) {
	if got, want := Enabled(), Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Enabled() before kingpin parsed the flags = %v, want the default-enabled collectors %v "+
			"(New with no names then builds an exporter that exports nothing)", got, want)
	}
}

// The exporter describes only the scrape_collector_* descriptors, the rest
// of its series vary with the node: a pedantic registry rejects them, which
// is why the tests use a plain one.
func TestPedanticRegistryRejectsTheUncheckedExporter(t *testing.T) {
	exp, err := New(sources(pollTwoGPUNode(t, twoGPUNode()), trainerStore(), nil), log.NewNopLogger(), Names()...)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(exp)
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "unregistered descriptor") {
		t.Errorf("pedantic gather: err = %v; if the exporter now describes every series, use a pedantic registry in the tests", err)
	}
}

// testutil.CollectAndLint registers with a pedantic registry, which rejects
// the exporter (TestPedanticRegistryRejectsTheUncheckedExporter): the same
// linter runs on a plain registry's output.
func TestRichestScrapePassesLint(t *testing.T) {
	node := twoGPUNode()
	node.SetUsed(1, 0, proc(1100, 6*GiB), proc(1101, 2*GiB))
	store := trainerStore()
	mustReport(store, 2000, "jax", []allocstats.DeviceReport{fullReport(gpuUUID(1), 4*GiB, 3*GiB)}, t0)
	reg := newRegistry(t, sources(pollTwoGPUNode(t, node), store, fakeResolver{1000: trainer}))
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// Every metric of the spec's table that the collectors own is in the
	// scrape, so the lint covers them all.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{
		"gpumem_gpu_info", "gpumem_gpu_memory_total_bytes", "gpumem_gpu_memory_used_bytes", "gpumem_gpu_memory_free_bytes",
		"gpumem_gpu_memory_reserved_bytes", "gpumem_gpu_memory_unattributed_bytes", "gpumem_gpu_processes",
		"gpumem_process_memory_used_bytes", "gpumem_process_memory_peak_bytes", "gpumem_process_context_bytes", "gpumem_process_info",
		"gpumem_allocator_reserved_bytes", "gpumem_allocator_active_bytes", "gpumem_allocator_inactive_bytes",
		"gpumem_allocator_allocated_bytes", "gpumem_allocator_inactive_split_bytes", "gpumem_allocator_peak_reserved_bytes",
		"gpumem_allocator_peak_active_bytes", "gpumem_allocator_limit_bytes", "gpumem_allocator_alloc_retries_total",
		"gpumem_allocator_ooms_total", "gpumem_allocator_last_oom_request_bytes", "gpumem_allocator_last_oom_timestamp_seconds",
		"gpumem_allocator_last_report_timestamp_seconds", "gpumem_nvml_up", "gpumem_nvml_poll_duration_seconds",
		"gpumem_nvml_errors_total", "gpumem_scrape_collector_success", "gpumem_scrape_collector_duration_seconds",
	} {
		if !got[name] {
			t.Errorf("%s missing from the richest scrape: the lint did not see it", name)
		}
	}
}

// countingAllocator counts how often a scrape copies the allocator store.
type countingAllocator struct {
	attribution.AllocatorSource
	calls atomic.Int32
}

func (c *countingAllocator) Processes() []allocstats.Process {
	c.calls.Add(1)
	return c.AllocatorSource.Processes()
}

func TestOneScrapeJoinsOnceForEveryCollector(t *testing.T) {
	src := sources(pollTwoGPUNode(t, twoGPUNode()), trainerStore(), fakeResolver{1000: trainer})
	counting := &countingAllocator{AllocatorSource: src.Join.Allocator}
	src.Join.Allocator = counting
	exp, err := New(src, log.NewNopLogger(), Names()...)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(exp)
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if n := counting.calls.Load(); n != 1 {
		t.Errorf("one scrape copied the allocator store %d times, want once (the process and allocator collectors share the join)", n)
	}
}
