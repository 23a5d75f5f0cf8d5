package landing

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/oom"
)

type fixedSnapshot struct{ s *nvmlpoll.Snapshot }

func (f fixedSnapshot) Snapshot() *nvmlpoll.Snapshot { return f.s }

type fixedProcs []allocstats.Process

func (f fixedProcs) Processes() []allocstats.Process { return f }

func join(snap *nvmlpoll.Snapshot, procs []allocstats.Process) attribution.View {
	return attribution.Sources{NVML: fixedSnapshot{snap}, Allocator: fixedProcs(procs)}.Read()
}

func mustReport(store *allocstats.Store, pid uint32, framework string, reports []allocstats.DeviceReport, now time.Time) {
	if err := allocstatstest.Report(store, allocstats.Identity{PID: pid, StartTime: 1}, framework, reports, now); err != nil {
		panic(err)
	}
}

const (
	MiB = 1 << 20
	GiB = 1 << 30
)

func uuid(i int) string { return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i) }

// splitSnapshot: GPU 0 (100 GiB, 1 GiB driver reserved, 30 GiB used, 69
// GiB free) runs pid 10 (12 GiB, reports 10 GiB reserved of which 7
// active), pid 11 (8 GiB, reports nothing), pid 12 (4 GiB, only an oom
// message so far), pid 13 (2 GiB, reports 3 GiB reserved: NVML lags the
// allocator) and pid 14 (1 GiB, reports reserved without an active split);
// 3 GiB are unattributed. GPU 1 is in MIG mode (skipped), GPU 2 lost its
// memory info (skipped), its MIG instance is GPU 1's.
func splitSnapshot() (*nvmlpoll.Snapshot, []allocstats.Process) {
	snap := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{
		{Index: 0, UUID: uuid(0), Name: "NVIDIA H200", MIGMode: nvmlpoll.MIGDisabled, HasMemory: true, HasProcesses: true,
			Memory: nvmlpoll.Memory{Total: 100 * GiB, Reserved: 1 * GiB, Used: 30 * GiB, Free: 69 * GiB, HasReserved: true},
			Processes: []nvmlpoll.Process{
				{PID: 10, HasUsed: true, UsedBytes: 12 * GiB},
				{PID: 11, HasUsed: true, UsedBytes: 8 * GiB},
				{PID: 12, HasUsed: true, UsedBytes: 4 * GiB},
				{PID: 13, HasUsed: true, UsedBytes: 2 * GiB},
				{PID: 14, HasUsed: true, UsedBytes: 1 * GiB},
			}},
		{Index: 1, UUID: uuid(1), MIGMode: nvmlpoll.MIGEnabled},
		{Index: 1, UUID: "MIG-00000000-0000-4000-9000-000000000001", ParentUUID: uuid(1), HasMemory: true, HasProcesses: true,
			Memory: nvmlpoll.Memory{Total: 20 * GiB, Used: 0, Free: 20 * GiB, HasReserved: true}},
		{Index: 2, UUID: uuid(2), MIGMode: nvmlpoll.MIGDisabled, HasProcesses: true},
	}}
	procs := []allocstats.Process{
		{PID: 10, Framework: "pytorch", Devices: []allocstats.DeviceStats{{UUID: uuid(0), HasStats: true, Reserved: 10 * GiB, Active: allocstats.Some(7 * GiB)}}},
		{PID: 12, Framework: "pytorch", Devices: []allocstats.DeviceStats{{UUID: uuid(0), LastOOMRequest: allocstats.Some(916 * MiB)}}},
		{PID: 13, Framework: "jax", Devices: []allocstats.DeviceStats{{UUID: uuid(0), HasStats: true, Reserved: 3 * GiB, Active: allocstats.Some(1 * GiB)}}},
		{PID: 14, Framework: "tensorflow", Devices: []allocstats.DeviceStats{{UUID: uuid(0), HasStats: true, Reserved: 512 * MiB}}},
	}
	return snap, procs
}

func TestSplitDividesEachGPUsMemory(t *testing.T) {
	snap, procs := splitSnapshot()
	views := Split(join(snap, procs), nil, 0)
	if len(views) != 2 {
		t.Fatalf("Split gave %d views, want 2 (GPU 0 and the MIG instance; not the MIG parent, not the GPU without memory info)", len(views))
	}
	if views[0].UUID != uuid(0) || views[1].UUID != snap.Devices[2].UUID || views[1].GPU != "1" {
		t.Errorf("views = %s (gpu %s), %s (gpu %s), want GPU 0 then GPU 1's MIG instance", views[0].UUID, views[0].GPU, views[1].UUID, views[1].GPU)
	}
	g := views[0]
	want := GPUView{
		GPU: "0", UUID: uuid(0), Name: "NVIDIA H200", Total: 100 * GiB,
		// pid 10: 12 - 10; pid 14: 1 GiB - 512 MiB.
		Context: 2*GiB + 512*MiB,
		// pid 10's 7 GiB; pid 14 reports no active: its reserved counts active.
		Active:   7*GiB + 512*MiB,
		Inactive: 3 * GiB,
		// pid 11 reports nothing, pid 12 only an oom message, pid 13's
		// reserved exceeds its used.
		NoStats:        8*GiB + 4*GiB + 2*GiB,
		Unattributed:   3 * GiB, // 30 - (12 + 8 + 4 + 2 + 1)
		DriverReserved: 1 * GiB,
		Free:           69 * GiB,
	}
	got := g
	got.Processes = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GPU 0 split:\n got %+v\nwant %+v", got, want)
	}
	if sum := g.Context + g.Active + g.Inactive + g.NoStats + g.Unattributed + g.DriverReserved + g.Free; sum != g.Total {
		t.Errorf("the parts add up to %d, want the total %d", sum, g.Total)
	}
	wantProcs := []ProcessView{
		{PID: 10, Used: 12 * GiB, Reports: true, Context: 2 * GiB, Active: 7 * GiB, Inactive: 3 * GiB, Reserved: 10 * GiB, Framework: "pytorch"},
		{PID: 11, Used: 8 * GiB},
		{PID: 12, Used: 4 * GiB},
		{PID: 13, Used: 2 * GiB},
		{PID: 14, Used: 1 * GiB, Reports: true, Context: 512 * MiB, Active: 512 * MiB, Reserved: 512 * MiB, Framework: "tensorflow"},
	}
	if len(g.Processes) != len(wantProcs) {
		t.Fatalf("GPU 0 has %d process rows, want %d", len(g.Processes), len(wantProcs))
	}
	for i, w := range wantProcs {
		if !reflect.DeepEqual(g.Processes[i], w) {
			t.Errorf("process row %d:\n got %+v\nwant %+v", i, g.Processes[i], w)
		}
	}
	if views[1].Total != 20*GiB || views[1].Free != 20*GiB || len(views[1].Processes) != 0 {
		t.Errorf("MIG instance view = %+v, want 20 GiB free and no processes", views[1])
	}
}

func TestSplitWithoutSnapshot(t *testing.T) {
	if v := Split(join(nil, nil), nil, 0); v != nil {
		t.Errorf("Split(nil) = %v, want nil", v)
	}
}

type fakeReports []oom.Report

func (r fakeReports) List() []oom.Report { return r }

func serve(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

func TestServeHTTPRendersTheGPUBars(t *testing.T) {
	snap, procs := splitSnapshot()
	store := allocstats.NewStore(0)
	for _, p := range procs {
		for _, d := range p.Devices {
			if d.HasStats {
				mustReport(store, p.PID, p.Framework, []allocstats.DeviceReport{{UUID: d.UUID, Reserved: d.Reserved, Active: d.Active}}, time.Now())
			}
		}
	}
	h := New(Config{
		Name: "gpumem_exporter", Version: "v1.2.3", MetricsPath: "/metrics", Backend: "simulated", Socket: "/run/gpumem/allocstats.sock",
		Sources: attribution.Sources{NVML: fixedSnapshot{snap}, Allocator: store},
		NVMLUp:  func() bool { return true },
		Reports: fakeReports{{Time: time.Unix(1_750_000_000, 0), GPU: "0", UUID: uuid(0), PID: 10, Comm: "python3",
			Namespace: "ml", Pod: "train-0", RequestedBytes: 916 * MiB}},
	})
	rec := serve(h, "/")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET / = %d, want 200; body: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("Content-Type = %q, want text/html", ct)
	}
	body := rec.Body.String()
	for _, want := range []string{
		`<div class="bar" title="GPU 0">`,
		`<div class="context" style="width:2.500%" title="context 2.50 GiB">`,
		`<div class="active" style="width:7.500%" title="active 7.50 GiB">`,
		`<div class="inactive" style="width:3.000%" title="inactive 3.00 GiB">`,
		`<div class="nostats" style="width:14.000%"`,
		`<div class="unattributed" style="width:3.000%"`,
		`<div class="driver" style="width:1.000%"`,
		`<div class="free" style="width:69.000%"`,
		`<div class="bar" title="GPU 1">`, // the MIG instance
		`href="/metrics"`,
		"tried to allocate 916.00 MiB",
		"ml/train-0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(body, "NVML is down") {
		t.Error("the page says NVML is down while it is up")
	}
	if n := strings.Count(body, `class="bar"`); n != 2 {
		t.Errorf("the page has %d GPU bars, want 2 (GPU 0 and the MIG instance)", n)
	}
}

func TestServeHTTPWithoutData(t *testing.T) {
	rec := serve(New(Config{Name: "gpumem_exporter", NVMLUp: func() bool { return false }}), "/")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET / = %d, want 200", rec.Code)
	}
	for _, want := range []string{"NVML is down", "No GPU data yet.", "None reported."} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("the page without data lacks %q", want)
		}
	}
}

// Without GPU data on the default backend, the page says what to do: install
// the NVIDIA driver on a GPU node, or run the simulated backend; the
// simulated backend needs neither.
func TestNoGPUDataSaysWhatToDo(t *testing.T) {
	for _, tc := range []struct {
		backend string
		up      bool
		hint    bool
	}{
		{"nvml", false, true},
		{"nvml", true, true}, // NVML runs and lists no GPU
		{"simulated", false, false},
	} {
		body := serve(New(Config{Name: "gpumem_exporter", Backend: tc.backend, NVMLUp: func() bool { return tc.up }}), "/").Body.String()
		for _, want := range []string{"install the NVIDIA driver", "libnvidia-ml.so.1", "--nvml.backend=simulated"} {
			if got := strings.Contains(body, want); got != tc.hint {
				t.Errorf("backend %s, NVML up %v: the page says %q: %v, want %v", tc.backend, tc.up, want, got, tc.hint)
			}
		}
	}
}

// Every part of the bar is explained on the page in a line of its own, and
// the GPU's size is given both as NVML's total and as what processes can
// have (total less driver reserved: PyTorch's "total capacity", the
// verdicts' figure), each named.
func TestPageExplainsEveryPartAndBothTotals(t *testing.T) {
	snap, procs := splitSnapshot()
	body := serve(New(Config{Name: "gpumem_exporter", MetricsPath: "/metrics", Backend: "simulated",
		Sources: attribution.Sources{NVML: fixedSnapshot{snap}, Allocator: fixedProcs(procs)}, NVMLUp: func() bool { return true }}), "/").Body.String()
	start := strings.Index(body, `<dl class="parts`)
	end := strings.Index(body[max(start, 0):], "</dl>")
	if start < 0 || end < 0 {
		t.Fatalf("the page has no explanation of the bar's parts:\n%s", body)
	}
	parts := body[start : start+end]
	for _, class := range []string{"context", "active", "inactive", "nostats", "unattributed", "driver", "free"} {
		// A part's swatch in the bar and in its explanation share the class.
		if !strings.Contains(body, `<div class="`+class+`" style=`) {
			t.Fatalf("the bar has no %s part: has the page changed?", class)
		}
		line := regexp.MustCompile(`<dt><i class="` + class + `"></i>[^<]+</dt> <dd>([^<]{20,})`).FindStringSubmatch(parts)
		if line == nil {
			t.Errorf("the bar's part %q is not explained in a line:\n%s", class, parts)
		}
	}
	for _, want := range []string{"100.00 GiB</span> total", "99.00 GiB</span> usable", `"total capacity"`, "driver reserved"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page does not say %q", want)
		}
	}
}

// fakeForecasts foresee, by pid, what foresight.Forecaster would.
type fakeForecasts map[uint32]diagnosis.Forecast

func (f fakeForecasts) TimeToOOM(pid uint32, _ uint64, _ string) (uint64, bool) {
	fc, ok := f[pid]
	return uint64(fc.ETA.Seconds()), ok
}

func (f fakeForecasts) Forecast(k diagnosis.Key) (diagnosis.Forecast, bool) {
	fc, ok := f[k.PID]
	return fc, ok
}

// processRow is the row of pid in the page's first process table.
func processRow(t *testing.T, body string, pid uint32) string {
	t.Helper()
	cell := fmt.Sprintf(`<td data-label="pid">%d</td>`, pid)
	for _, row := range strings.Split(between(t, body, `<table class="procs">`, "</table>"), "<tr>")[1:] {
		if strings.HasPrefix(row, cell) {
			return row
		}
	}
	t.Fatalf("the page has no row of pid %d", pid)
	return ""
}

// A process whose climb the daemon measured shows when it runs out of
// memory, and what climbs; in the warning style under the daemon's
// warning threshold. A process without an estimate shows none, and the
// legend explains the estimate.
func TestPageShowsTheTimeToOOM(t *testing.T) {
	snap, procs := splitSnapshot()
	forecasts := fakeForecasts{
		10: {Climb: diagnosis.Climb{Cause: diagnosis.Leak}, ETA: 6 * time.Minute},
		13: {Climb: diagnosis.Climb{Cause: diagnosis.Growth}, ETA: 150 * time.Minute},
	}
	type row struct {
		eta    string // "": none
		warned bool
	}
	for _, tc := range []struct {
		name       string
		warnBefore time.Duration
		causes     bool // Config.Forecasts is set
		rows       map[uint32]row
		legend     string
	}{
		{"default threshold", 0, true, map[uint32]row{
			10: {"in about 6 minutes (leak)", true}, 13: {"in about 2.5 hours (growth)", false}, 11: {}, 14: {},
		}, "in red under 10 minutes"},
		{"threshold under the estimate", 5 * time.Minute, true, map[uint32]row{
			10: {"in about 6 minutes (leak)", false}, 13: {"in about 2.5 hours (growth)", false},
		}, "in red under 5 minutes"},
		{"no warnings", -1, true, map[uint32]row{
			10: {"in about 6 minutes (leak)", false},
		}, "the daemon warns no process"},
		{"causes unknown", 0, false, map[uint32]row{
			10: {"in about 6 minutes", true}, 13: {"in about 2.5 hours", false},
		}, "in red under 10 minutes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Name: "gpumem_exporter", MetricsPath: "/metrics", Backend: "simulated", WarnBefore: tc.warnBefore,
				Sources: attribution.Sources{NVML: fixedSnapshot{snap}, Allocator: fixedProcs(procs), Forecasts: forecasts},
				NVMLUp:  func() bool { return true }}
			if tc.causes {
				cfg.Forecasts = forecasts
			}
			body := render(t, cfg)
			for pid, want := range tc.rows {
				r := processRow(t, body, pid)
				i := strings.Index(r, `<td class="eta"`)
				if i < 0 {
					t.Fatalf("pid %d: the row has no time-to-OOM cell: %s", pid, r)
				}
				got := text(r[i:])
				if got != want.eta {
					t.Errorf("pid %d: the row says %q of its time to OOM, want %q", pid, got, want.eta)
				}
				if warned := strings.Contains(r, `class="num soon"`); warned != want.warned {
					t.Errorf("pid %d: warning style %v, want %v; row: %s", pid, warned, want.warned, r)
				}
			}
			legend := text(between(t, body, `<div><dt>runs out</dt>`, "</div>"))
			for _, want := range []string{"the daemon's estimate", "climb of its active memory", tc.legend} {
				if !strings.Contains(legend, want) {
					t.Errorf("the legend of the time to OOM lacks %q: %s", want, legend)
				}
			}
		})
	}
}

func TestETA(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "now"},
		{45 * time.Second, "in about 45 s"},
		{3 * time.Minute, "in about 3 minutes"},
		{150 * time.Minute, "in about 2.5 hours"},
	} {
		if got := eta(tc.d); got != tc.want {
			t.Errorf("eta(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestServeHTTPNotFoundElsewhere(t *testing.T) {
	h := New(Config{})
	for _, path := range []string{"/index.html", "/metricz", "/api/v1/oom-reports/x"} {
		if rec := serve(h, path); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, rec.Code)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1.00 KiB"},
		{1536, "1.50 KiB"},
		{MiB, "1.00 MiB"},
		{916 * MiB, "916.00 MiB"},
		{GiB, "1.00 GiB"},
		{150754820096, "140.40 GiB"}, // an H200's total
		{1 << 40, "1.00 TiB"},
		{1 << 50, "1.00 PiB"},
		{1 << 60, "1024.00 PiB"}, // PiB is the largest unit
		{^uint64(0), "16384.00 PiB"},
	} {
		if got := FormatBytes(tc.in); got != tc.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
