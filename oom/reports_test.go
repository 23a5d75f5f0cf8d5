package oom

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-kit/log"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/internal/mocknode"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/workload"
)

const mib = 1 << 20

var (
	testUUID  = mocknode.GPUUUID(3)
	testUUID2 = mocknode.GPUUUID(0)
	t0        = time.Unix(1_750_000_000, 0)
)

type fixedSnapshot struct{ s *nvmlpoll.Snapshot }

func (f fixedSnapshot) Snapshot() *nvmlpoll.Snapshot { return f.s }

type fakeResolver map[uint32]workload.Info

func (r fakeResolver) Lookup(pid uint32) (workload.Info, bool) {
	in, ok := r[pid]
	return in, ok
}

// sources joins snap (may be nil), store (may be nil) and the fixture's
// workload labels.
func sources(snap *nvmlpoll.Snapshot, store *allocstats.Store) attribution.Sources {
	src := attribution.Sources{NVML: fixedSnapshot{snap}, Workload: describeFixture}
	if store != nil {
		src.Allocator = store
	}
	return src
}

func mustReport(t *testing.T, store *allocstats.Store, pid uint32, r allocstats.DeviceReport) {
	t.Helper()
	if err := allocstatstest.Report(store, allocstats.Identity{PID: pid, StartTime: 1}, "", []allocstats.DeviceReport{r}, t0); err != nil {
		t.Fatal(err)
	}
}

func mustReportOOM(t *testing.T, store *allocstats.Store, pid uint32, m allocstats.OOMMessage) allocstats.OOMEvent {
	t.Helper()
	ev, err := allocstatstest.OOM(store, allocstats.Identity{PID: pid, StartTime: 1}, m, t0)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// oomFixture: GPU 3 as NVML saw it when pid 100 ran out of memory, and the
// allocator stats of the processes that report.
func oomFixture(t *testing.T) (*allocstats.Store, *nvmlpoll.Snapshot) {
	t.Helper()
	snap := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{
		{Index: 0, UUID: testUUID2, HasMemory: true, HasProcesses: true},
		{
			Index: 3, UUID: testUUID, HasMemory: true, HasProcesses: true,
			Memory: nvmlpoll.Memory{Total: 143771 * mib, Used: 11000 * mib, Free: 132771 * mib, Reserved: 615 * mib, HasReserved: true},
			Processes: []nvmlpoll.Process{
				{PID: 100, HasUsed: true, UsedBytes: 3590 * mib, Name: "python3"},
				{PID: 200, HasUsed: true, UsedBytes: 6016 * mib, Name: "python3"},
				{PID: 300, HasUsed: true, UsedBytes: 522 * mib, Name: "/usr/bin/ffmpeg"},
				{PID: 400, HasUsed: false, Name: "python3"},
			},
		},
	}}
	store := allocstats.NewStore(time.Minute)
	stats := func(pid uint32, uuid string, reserved, active uint64) {
		mustReport(t, store, pid, allocstats.DeviceReport{UUID: uuid, Reserved: reserved, Active: allocstats.Some(active)})
	}
	stats(100, testUUID, 3072*mib, 3000*mib)
	stats(200, testUUID, 5496*mib, 0)
	stats(400, testUUID, 100*mib, 100*mib)
	stats(500, testUUID, 200*mib, 50*mib) // reports, but NVML does not list it
	stats(600, testUUID2, 1*mib, 1*mib)   // another device
	return store, snap
}

var describeFixture = fakeResolver{
	100: {Comm: "train", Namespace: "ml", Pod: "trainer-0", Container: "main"},
	200: {Comm: "eval"},
}

func u64(v uint64) *uint64 { return &v }

func TestOOMReportDescribesTheWholeDevice(t *testing.T) {
	store, snap := oomFixture(t)
	var logBuf bytes.Buffer
	reports := New(Config{Capacity: 4, Sources: sources(snap, store), Logger: log.NewLogfmtLogger(&logBuf)})
	reports.ObserveOOM(mustReportOOM(t, store, 100, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 916 * mib, LimitBytes: allocstats.Some(4096 * mib)}))

	list := reports.List()
	if len(list) != 1 {
		t.Fatalf("List has %d reports, want 1", len(list))
	}
	got := list[0]
	want := Report{
		Time: t0, GPU: "3", UUID: testUUID, PID: 100,
		Comm: "train", Namespace: "ml", Pod: "trainer-0", Container: "main",
		RequestedBytes: 916 * mib, LimitBytes: u64(4096 * mib),
		DeviceMemory: &DeviceMemory{TotalBytes: 143771 * mib, UsedBytes: 11000 * mib, FreeBytes: 132771 * mib, ReservedBytes: u64(615 * mib)},
		// pid 500 is not in the totals: NVML does not list it.
		Totals: Totals{
			ReservedBytes:     (3072 + 5496 + 100) * mib,
			ActiveBytes:       (3000 + 0 + 100) * mib,
			InactiveBytes:     (72 + 5496 + 0) * mib,
			ContextBytes:      (518 + 520) * mib,
			UnattributedBytes: u64((11000 - 3590 - 6016 - 522) * mib),
		},
		Processes: []Process{
			{PID: 200, Comm: "eval", NVMLListed: true, UsedBytes: u64(6016 * mib), ContextBytes: u64(520 * mib), ReservedBytes: u64(5496 * mib), ActiveBytes: u64(0), InactiveBytes: u64(5496 * mib)},
			{PID: 100, Comm: "train", Namespace: "ml", Pod: "trainer-0", Container: "main", Reporting: true, NVMLListed: true, UsedBytes: u64(3590 * mib), ContextBytes: u64(518 * mib), ReservedBytes: u64(3072 * mib), ActiveBytes: u64(3000 * mib), InactiveBytes: u64(72 * mib)},
			{PID: 300, Comm: "ffmpeg", NVMLListed: true, UsedBytes: u64(522 * mib)},
			{PID: 400, Comm: "python3", NVMLListed: true, ReservedBytes: u64(100 * mib), ActiveBytes: u64(100 * mib), InactiveBytes: u64(0)},
			// Listed last though it claims more than pid 400 holds.
			{PID: 500, ReservedBytes: u64(200 * mib), ActiveBytes: u64(50 * mib), InactiveBytes: u64(150 * mib)},
		},
	}
	// 3072 MiB reserved + 916 MiB is under the 4096 MiB limit, with 129
	// GiB free: the figures cannot tell (the verdict's own tests are in
	// diagnosis).
	if got.Verdict.Cause != diagnosis.Unknown || got.Verdict.Figures["reserved_bytes"] != 3072*mib {
		t.Errorf("verdict %+v: want unknown, resting on the 3072 MiB reserved", got.Verdict)
	}
	want.Verdict = got.Verdict
	gotJSON, _ := json.MarshalIndent(got, "", " ")
	wantJSON, _ := json.MarshalIndent(want, "", " ")
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("report\n got %s\nwant %s", gotJSON, wantJSON)
	}

	logged := logBuf.String()
	for _, kv := range []string{
		`level=warn`, `msg="CUDA out of memory reported"`, `pid=100`, `comm=train`, `gpu=3`, `uuid=` + testUUID,
		`requested_bytes=960495616`, `context_bytes=1088421888`, `top_holder_pid=200`, `top_holder_comm=eval`,
	} {
		if !strings.Contains(logged, kv) {
			t.Errorf("log line lacks %s: %s", kv, logged)
		}
	}
}

func TestOOMReportWithoutNVMLKnowledge(t *testing.T) {
	store := allocstats.NewStore(time.Minute)
	reports := New(Config{Capacity: 0, Sources: sources(nil, store), Logger: nil})
	reports.ObserveOOM(mustReportOOM(t, store, 7, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 5}))
	got := reports.List()[0]
	if got.GPU != "" || got.DeviceMemory != nil || got.Totals.UnattributedBytes != nil || len(got.Processes) != 0 {
		t.Errorf("report without a snapshot and without stats: %+v", got)
	}
	if got.PID != 7 || got.RequestedBytes != 5 {
		t.Errorf("report = %+v, want pid 7 asking for 5 bytes", got)
	}
}

func TestOOMReportsKeepTheNewestInARing(t *testing.T) {
	reports := New(Config{Capacity: 2, Logger: nil})
	for i := uint64(1); i <= 3; i++ {
		reports.ObserveOOM(allocstats.OOMEvent{Time: t0, PID: uint32(i), UUID: testUUID, Requested: i})
		if n := len(reports.List()); n != int(min(i, 2)) {
			t.Fatalf("after %d reports List has %d", i, n)
		}
	}
	list := reports.List()
	if list[0].PID != 3 || list[1].PID != 2 {
		t.Errorf("List = pids %d, %d; want 3, 2 (newest first)", list[0].PID, list[1].PID)
	}
}

func TestOOMReportsHTTP(t *testing.T) {
	reports := New(Config{Capacity: 2, Logger: nil})
	get := func(method string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		reports.ServeHTTP(rec, httptest.NewRequest(method, "/api/v1/oom-reports", nil))
		return rec
	}
	if rec := get(http.MethodGet); rec.Code != 200 || rec.Body.String() != `{"reports":[]}`+"\n" || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("empty: %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
	reports.ObserveOOM(allocstats.OOMEvent{Time: t0, PID: 9, UUID: testUUID, Requested: 1, Free: allocstats.Some(2)})
	rec := get(http.MethodGet)
	var body struct {
		Reports []map[string]any `json:"reports"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("decoding %s: %v", rec.Body.String(), err)
	}
	if len(body.Reports) != 1 || body.Reports[0]["pid"] != float64(9) || body.Reports[0]["free_bytes"] != float64(2) {
		t.Errorf("body = %s", rec.Body.String())
	}
	if _, ok := body.Reports[0]["limit_bytes"]; ok {
		t.Errorf("an unknown limit is in the JSON: %s", rec.Body.String())
	}
	if rec := get(http.MethodPost); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST answered %d, want 405", rec.Code)
	}
}

func TestOOMLoggingIsRateLimited(t *testing.T) {
	var mu sync.Mutex
	var warns int
	logger := log.LoggerFunc(func(kv ...any) error {
		mu.Lock()
		defer mu.Unlock()
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == "level" && strings.Contains(strings.ToLower(toString(kv[i+1])), "warn") {
				warns++
			}
		}
		return nil
	})
	reports := New(Config{Capacity: 2, Logger: logger})
	for i := 0; i < 100; i++ { // 100 processes of 100 users: no report is over a rate
		reports.ObserveOOM(allocstats.OOMEvent{Time: t0, PID: uint32(i), UID: uint32(i), UUID: testUUID})
	}
	if warns != 10 {
		t.Errorf("100 OOMs at once logged %d warnings, want the burst of 10", warns)
	}
}

func toString(v any) string {
	if s, ok := v.(interface{ String() string }); ok {
		return s.String()
	}
	s, _ := v.(string)
	return s
}

// A burst just before the failure shows in the allocator's reserved (read
// inside the OOM observer) before NVML's next poll: the process is ranked
// by the larger of the two.
func TestOOMReportRanksByTheLargerOfUsedAndReserved(t *testing.T) {
	snap := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{{
		Index: 0, UUID: testUUID, HasMemory: true, HasProcesses: true,
		Memory: nvmlpoll.Memory{Total: 143771 * mib, Used: 2000 * mib, Free: 141771 * mib},
		Processes: []nvmlpoll.Process{
			{PID: 100, HasUsed: true, UsedBytes: 522 * mib},
			{PID: 200, HasUsed: true, UsedBytes: 1478 * mib},
		},
	}}}
	store := allocstats.NewStore(time.Minute)
	mustReport(t, store, 100, allocstats.DeviceReport{UUID: testUUID, Reserved: 3666 * mib, Active: allocstats.Some(3664 * mib)})
	reports := New(Config{Capacity: 1, Sources: sources(snap, store), Logger: log.NewNopLogger()})
	reports.ObserveOOM(mustReportOOM(t, store, 100, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 916 * mib}))
	got := reports.List()[0].Processes
	if len(got) != 2 || got[0].PID != 100 || got[0].ContextBytes != nil {
		t.Errorf("processes = %+v; want pid 100 (3666 MiB reserved) first, and no context while NVML's used is older than its reserved", got)
	}
}

// On the H200 an OOM report showed context 0 B: NVML's used came from the
// poll before the burst that caused the OOM. A report is built from a
// reading taken after the event; where that reading still lags the
// allocator, the process keeps its last consistent context, marked stale.
func TestOOMReportUsesAFreshReadingAndTheLastConsistentContext(t *testing.T) {
	device := func(at time.Time, used100, used200 uint64) *nvmlpoll.Snapshot {
		return &nvmlpoll.Snapshot{Time: at, Devices: []nvmlpoll.Device{{
			Index: 3, UUID: testUUID, HasMemory: true, HasProcesses: true,
			Memory: nvmlpoll.Memory{Total: 143771 * mib, Used: used100 + used200, Free: 143771*mib - used100 - used200},
			Processes: []nvmlpoll.Process{
				{PID: 100, HasUsed: true, UsedBytes: used100},
				{PID: 200, HasUsed: true, UsedBytes: used200},
			},
		}}}
	}
	store := allocstats.NewStore(time.Minute)
	mustReport(t, store, 100, allocstats.DeviceReport{UUID: testUUID, Reserved: 3072 * mib, Active: allocstats.Some(3000 * mib)})
	mustReport(t, store, 200, allocstats.DeviceReport{UUID: testUUID, Reserved: 1000 * mib, Active: allocstats.Some(1000 * mib)})
	before := device(t0.Add(-time.Second), 3590*mib, 1520*mib)
	// After the burst: pid 100's allocator holds 3666 MiB, NVML's fresh
	// reading has not caught up; pid 200's is consistent.
	fresh := device(t0.Add(300*time.Millisecond), 3590*mib, 1520*mib)
	var freshCalls int
	reports := New(Config{Sources: sources(before, store), Logger: log.NewNopLogger(),
		Fresh: func(context.Context) (*nvmlpoll.Snapshot, error) { freshCalls++; return fresh, nil }})
	reports.ObserveView(reports.cfg.Sources.ReadAt(before))
	mustReport(t, store, 100, allocstats.DeviceReport{UUID: testUUID, Reserved: 3666 * mib, Active: allocstats.Some(3664 * mib)})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { reports.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitUntil(t, "Run to start", reports.active.Load)
	reports.ObserveOOM(mustReportOOM(t, store, 100, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 916 * mib}))
	waitUntil(t, "the report", func() bool { return len(reports.List()) == 1 })

	rep := reports.List()[0]
	if freshCalls != 1 || rep.NVMLTime == nil || !rep.NVMLTime.Equal(fresh.Time) || rep.NVMLDelaySeconds == nil || *rep.NVMLDelaySeconds != 0.3 {
		t.Errorf("NVML reading of the report: time %v, delay %v after %d Fresh calls; want the fresh reading, 0.3 s after the OOM", rep.NVMLTime, rep.NVMLDelaySeconds, freshCalls)
	}
	byPID := map[uint32]Process{}
	for _, p := range rep.Processes {
		byPID[p.PID] = p
	}
	if p := byPID[100]; p.ContextBytes == nil || *p.ContextBytes != 518*mib || !p.ContextStale {
		t.Errorf("reporter's context = %v (stale %v), want 518 MiB from its last consistent reading, marked stale", p.ContextBytes, p.ContextStale)
	}
	if p := byPID[200]; p.ContextBytes == nil || *p.ContextBytes != 520*mib || p.ContextStale {
		t.Errorf("pid 200's context = %v (stale %v), want 520 MiB from the fresh reading", p.ContextBytes, p.ContextStale)
	}
	if rep.Totals.ContextBytes != (518+520)*mib {
		t.Errorf("total context = %d MiB, want %d", rep.Totals.ContextBytes/mib, 518+520)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func dropped(t *testing.T, r *Reports, reason string) float64 {
	t.Helper()
	var m dto.Metric
	if err := r.metrics.dropped.WithLabelValues(reason).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestOOMReportsAreRateLimitedPerProcessAndPerUID(t *testing.T) {
	reports := New(Config{Capacity: 32, Logger: log.NewNopLogger()})
	at := func(d time.Duration, pid, uid uint32) {
		reports.ObserveOOM(allocstats.OOMEvent{Time: t0.Add(d), PID: pid, UID: uid, StartTime: 1, UUID: testUUID})
	}
	// One process in a loop: one report per PIDReportInterval.
	for i := 0; i < 50; i++ {
		at(time.Duration(i)*100*time.Millisecond, 1, 1000)
	}
	at(PIDReportInterval, 1, 1000)
	if n := len(reports.List()); n != 2 {
		t.Errorf("one process, 51 OOMs over 10 s: %d reports, want 2", n)
	}
	if got := dropped(t, reports, dropPIDRate); got != 49 {
		t.Errorf("dropped for the pid rate = %v, want 49", got)
	}
	// One user with many processes: a burst, then the per-minute rate.
	for pid := uint32(100); pid < 200; pid++ {
		at(time.Minute, pid, 65534)
	}
	at(time.Minute+10*time.Second, 200, 65534)
	if got := dropped(t, reports, dropUIDRate); got != 100-UIDReportsPerMinute {
		t.Errorf("dropped for the uid rate = %v, want %d", got, 100-UIDReportsPerMinute)
	}
	var mine int
	for _, r := range reports.List() {
		if r.uid == 65534 {
			mine++
		}
	}
	if mine != UIDReportsPerMinute+1 {
		t.Errorf("the flooding uid has %d reports, want a burst of %d and one more 10 s later", mine, UIDReportsPerMinute)
	}
}

// TestOOMFloodDoesNotEraseOtherUsersReports: a user who fills the ring
// replaces its own reports, not the victim's.
func TestOOMFloodDoesNotEraseOtherUsersReports(t *testing.T) {
	reports := New(Config{Capacity: 8, Logger: log.NewNopLogger()})
	reports.ObserveOOM(allocstats.OOMEvent{Time: t0, PID: 1, UID: 1000, StartTime: 1, UUID: testUUID, Requested: 42})
	for i := 0; i < 1000; i++ { // an hour of one report per 4 s, past every rate
		reports.ObserveOOM(allocstats.OOMEvent{Time: t0.Add(time.Duration(i) * 10 * time.Second), PID: uint32(10 + i), UID: 65534, StartTime: 1, UUID: testUUID})
	}
	count := func() (victim, attacker int) {
		for _, r := range reports.List() {
			switch r.uid {
			case 1000:
				victim++
			case 65534:
				attacker++
			}
		}
		return
	}
	if victim, attacker := count(); victim != 1 || attacker != 7 {
		t.Errorf("reports kept: victim %d (want 1), attacker %d (want the other 7)", victim, attacker)
	}
	// The victim's next report replaces one of the flood's, not its first.
	reports.ObserveOOM(allocstats.OOMEvent{Time: t0.Add(time.Hour), PID: 2, UID: 1000, StartTime: 1, UUID: testUUID})
	if victim, attacker := count(); victim != 2 || attacker != 6 {
		t.Errorf("after another victim report: victim %d (want 2), attacker %d (want 6)", victim, attacker)
	}
}

// TestOOMBlameAndInflation: a process NVML does not list, claiming the
// most memory there is, neither ranks first nor counts in the totals, and
// a report lists a bounded number of processes.
func TestOOMBlameAndInflation(t *testing.T) {
	const huge = 1<<64 - 1
	procs := []nvmlpoll.Process{{PID: 1, HasUsed: true, UsedBytes: 1000 * mib}}
	for pid := uint32(2); pid < 100; pid++ {
		procs = append(procs, nvmlpoll.Process{PID: pid, HasUsed: true, UsedBytes: 10 * mib})
	}
	snap := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{{
		Index: 0, UUID: testUUID, HasMemory: true, HasProcesses: true,
		Memory: nvmlpoll.Memory{Total: 143771 * mib, Used: 1990 * mib}, Processes: procs,
	}}}
	store := allocstats.NewStore(time.Minute)
	mustReport(t, store, 666, allocstats.DeviceReport{UUID: testUUID, Reserved: huge, Active: allocstats.Some(huge)})
	mustReport(t, store, 99, allocstats.DeviceReport{UUID: testUUID, Reserved: 5 * mib})
	var logBuf bytes.Buffer
	reports := New(Config{Capacity: 2, Sources: sources(snap, store), Logger: log.NewLogfmtLogger(&logBuf)})
	reports.ObserveOOM(mustReportOOM(t, store, 99, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 1}))
	rep := reports.List()[0]
	if top := rep.Processes[0]; top.PID != 1 {
		t.Errorf("top holder = pid %d, want pid 1 (the largest NVML lists), not the claim of pid 666", top.PID)
	}
	if strings.Contains(logBuf.String(), "top_holder_pid=666") || strings.Contains(logBuf.String(), "18446744073709551615") {
		t.Errorf("the log blames or repeats the unlisted claim: %s", logBuf.String())
	}
	if rep.Totals.ReservedBytes != 5*mib || rep.Totals.ActiveBytes != 0 {
		t.Errorf("totals = %+v, want only the reporter's 5 MiB reserved", rep.Totals)
	}
	if len(rep.Processes) != MaxReportProcesses || rep.OmittedProcesses != 100-MaxReportProcesses {
		t.Errorf("report lists %d processes and omits %d; want %d and %d", len(rep.Processes), rep.OmittedProcesses, MaxReportProcesses, 100-MaxReportProcesses)
	}
	reporter := false
	for _, p := range rep.Processes {
		reporter = reporter || (p.Reporting && p.PID == 99)
	}
	if !reporter {
		t.Error("the reporting process was cut from its own report")
	}
	body, _ := json.Marshal(rep)
	if len(body) > 16<<10 {
		t.Errorf("a report of 100 processes is %d bytes, want it bounded", len(body))
	}
}

func TestOOMVerdictReachesTheProcessTheCountersAndTheSinks(t *testing.T) {
	store, snap := oomFixture(t)
	var logBuf bytes.Buffer
	var hooked []Report
	reports := New(Config{Capacity: 4, Sources: sources(snap, store), Logger: log.NewLogfmtLogger(&logBuf),
		Sinks: []ReportSink{collectReports{&hooked}}})
	// At the failure: 3800 MiB reserved under a 4096 MiB limit, 916 MiB
	// asked for, the GPU nearly empty.
	mustReport(t, store, 100, allocstats.DeviceReport{UUID: testUUID, Reserved: 3800 * mib, Active: allocstats.Some(3700 * mib), Limit: allocstats.Some(4096 * mib)})
	ev := mustReportOOM(t, store, 100, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 916 * mib, LimitBytes: allocstats.Some(4096 * mib), FreeBytes: allocstats.Some(130000 * mib)})
	var answered [][]byte
	ev.ReplyTo = collectLines{&answered}
	ev.Time = time.Now() // the info metric names reports of the last minutes
	reports.ObserveOOM(ev)

	got := reports.List()[0].Verdict
	if got.Cause != diagnosis.Limit || !strings.Contains(got.Summary, "limit of 4.00 GiB") {
		t.Fatalf("verdict %+v: want limit", got)
	}
	if len(answered) != 1 {
		t.Fatalf("the process got %d answers, want 1", len(answered))
	}
	var msg map[string]any
	if err := json.Unmarshal(answered[0], &msg); err != nil || msg["type"] != "verdict" || msg["cause"] != "limit" || msg["summary"] != got.Summary || answered[0][len(answered[0])-1] != '\n' {
		t.Errorf("answer %q (%v): want one verdict line with the cause and summary", answered[0], err)
	}
	if len(hooked) != 1 || hooked[0].Verdict.Cause != diagnosis.Limit {
		t.Errorf("the sink got %d reports, want the one with its verdict", len(hooked))
	}
	if !strings.Contains(logBuf.String(), "cause=limit") {
		t.Errorf("log line %q does not say the cause", logBuf.String())
	}
	want := `
# HELP gpumem_allocator_last_oom_info The cause of the process's last out-of-memory report on the GPU (cause: limit, fragmentation, neighbours, too_large, leak, growth, contexts, unknown), for 10 minutes after it.
# TYPE gpumem_allocator_last_oom_info gauge
gpumem_allocator_last_oom_info{cause="limit",comm="train",container="main",gpu="3",namespace="ml",pid="100",pod="trainer-0",uuid="` + testUUID + `"} 1
# HELP gpumem_oom_reports_total Out-of-memory reports, by the cause of their verdict (limit, fragmentation, neighbours, too_large, leak, growth, contexts, unknown).
# TYPE gpumem_oom_reports_total counter
gpumem_oom_reports_total{cause="contexts"} 0
gpumem_oom_reports_total{cause="fragmentation"} 0
gpumem_oom_reports_total{cause="growth"} 0
gpumem_oom_reports_total{cause="leak"} 0
gpumem_oom_reports_total{cause="limit"} 1
gpumem_oom_reports_total{cause="neighbours"} 0
gpumem_oom_reports_total{cause="too_large"} 0
gpumem_oom_reports_total{cause="unknown"} 0
`
	if err := testutil.CollectAndCompare(reports, strings.NewReader(want), "gpumem_oom_reports_total", "gpumem_allocator_last_oom_info"); err != nil {
		t.Error(err)
	}
}

func TestOOMVerdictReadsTheTrendObservedBefore(t *testing.T) {
	store, snap := oomFixture(t)
	trends := &historyTrends{diagnosis.NewHistory()}
	reports := New(Config{Capacity: 4, Sources: sources(snap, store), Trends: trends})
	// pid 100's active memory climbs 64 MiB a second for two minutes
	// under a 10 GiB limit, on the samples' clock: a leak.
	var last time.Time
	for s := 0; s < 120; s++ {
		active := uint64(2048+64*s) * mib
		last = t0.Add(time.Duration(s-120) * time.Second)
		mustReport(t, store, 100, allocstats.DeviceReport{UUID: testUUID, Reserved: active + 10*mib, Active: allocstats.Some(active), Limit: allocstats.Some(10240 * mib), At: last})
		trends.Note(diagnosis.Key{PID: 100, Start: 1, UUID: testUUID}, last, active)
	}
	ev := mustReportOOM(t, store, 100, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 64 * mib, LimitBytes: allocstats.Some(10240 * mib), FreeBytes: allocstats.Some(100000 * mib)})
	if !ev.Stats.SampledAt.Equal(last) {
		t.Fatalf("the OOM's stats were sampled at %v, want %v (the report's own time)", ev.Stats.SampledAt, last)
	}
	reports.ObserveOOM(ev)
	v := reports.List()[0].Verdict
	if v.Cause != diagnosis.Leak || v.Figures["trend_seconds"] < 100 {
		t.Errorf("verdict %+v: want a leak, from the two minutes of trend", v)
	}
	if v.Figures["time_to_oom_seconds"] != 42 || v.Figures["climb_bytes_per_minute"] != 3840*mib {
		t.Errorf("figures %v: want the forecast's time_to_oom_seconds 42 and climb_bytes_per_minute 3840 MiB", v.Figures)
	}
}

func TestOOMReportSentenceSaysWhatAndWhy(t *testing.T) {
	rep := Report{GPU: "2", PID: 7, RequestedBytes: 916 * mib, Verdict: diagnosis.Verdict{
		Cause: diagnosis.Neighbours, Contributing: []diagnosis.Cause{diagnosis.Contexts},
		Summary: "The GPU had 1.00 GiB free.", Remedy: "Ask pid 9."}}
	want := "CUDA out of memory on GPU 2 (pid 7 tried to allocate 916.00 MiB): neighbours (also: contexts). The GPU had 1.00 GiB free. First: Ask pid 9."
	if got := rep.Sentence(); got != want {
		t.Errorf("Sentence() = %q, want %q", got, want)
	}
}

// TestOOMVerdictTellsOnlyAListedProcessAboutItsNeighbours: any local
// process can send an oom for any GPU, with a free_bytes of its choosing.
// Its verdict (its stderr, an Event on its pod) names other processes and
// their figures only when NVML lists it on that GPU, and a free figure far
// below NVML's reading is not believed.
func TestOOMVerdictTellsOnlyAListedProcessAboutItsNeighbours(t *testing.T) {
	tests := []struct {
		name     string
		pid      uint32
		nvmlFree uint64 // the device's free memory in NVML's reading
		free     uint64 // what the oom message says
		wantFree uint64 // the figure the verdict rests on
		named    bool   // the verdict may name pid 200 ("eval")
	}{
		{"a process NVML does not list, claiming 1 MiB free", 500, 132771 * mib, 1 * mib, 132771 * mib, false},
		{"a process NVML does not list, NVML agreeing the GPU is full", 500, 400 * mib, 300 * mib, 300 * mib, false},
		{"a listed process claiming 1 MiB free on an empty GPU", 100, 132771 * mib, 1 * mib, 132771 * mib, false},
		{"a listed process on a full GPU", 100, 400 * mib, 300 * mib, 300 * mib, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store, snap := oomFixture(t)
			snap.Devices[1].Memory.Free = tt.nvmlFree
			reports := New(Config{Capacity: 4, Sources: sources(snap, store)})
			reports.ObserveOOM(mustReportOOM(t, store, tt.pid, allocstats.OOMMessage{UUID: testUUID, RequestedBytes: 916 * mib, FreeBytes: allocstats.Some(tt.free)}))
			rep := reports.List()[0]
			v := rep.Verdict
			text := v.Summary + " " + v.Remedy + " " + rep.Sentence()
			mentions := len(v.Holders) > 0 || strings.Contains(text, "pid 200") || strings.Contains(text, "eval")
			if mentions && !tt.named {
				t.Errorf("verdict names another process: %s %+v", text, v.Holders)
			}
			if tt.named && (v.Cause != diagnosis.Neighbours || !mentions) {
				t.Errorf("verdict %s: %s; want neighbours, naming pid 200", v.Cause, text)
			}
			if got, ok := v.Figures["free_bytes"]; ok && got != tt.wantFree {
				t.Errorf("verdict rests on free_bytes %d MiB, want %d MiB", got/mib, tt.wantFree/mib)
			}
		})
	}
}

// historyTrends is the Trends of a history the test notes itself, with a
// fixed forecast.
type historyTrends struct{ *diagnosis.History }

func (h *historyTrends) Forecast(diagnosis.Key) (diagnosis.Forecast, bool) {
	return diagnosis.Forecast{Climb: diagnosis.Climb{Cause: diagnosis.Leak, Rate: 64 * mib, At: t0.Add(-time.Second)}, ETA: 42 * time.Second}, true
}

// collectReports is a ReportSink that keeps what it is given.
type collectReports struct{ got *[]Report }

func (c collectReports) Deliver(rep Report) { *c.got = append(*c.got, rep) }

// collectLines is a client's connection that keeps the lines it is sent
// (allocstats.Replier).
type collectLines struct{ got *[][]byte }

func (c collectLines) Reply(line []byte) { *c.got = append(*c.got, line) }
