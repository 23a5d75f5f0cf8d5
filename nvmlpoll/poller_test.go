package nvmlpoll

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func pollOnce(t *testing.T, p *Poller) *Snapshot {
	t.Helper()
	if err := p.Poll(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	return p.Snapshot()
}

func TestPollReadsEveryGPUAndProcess(t *testing.T) {
	p := NewPoller(Config{Lib: newMockNode()})
	snap := pollOnce(t, p)
	if got := len(snap.Devices); got != 8 {
		t.Fatalf("devices = %d, want 8", got)
	}
	d := snap.Devices[3]
	if d.UUID != testUUID(3) || d.GPULabel() != "3" || d.PCIBusID != "00000000:04:00.0" || d.MIGMode != MIGDisabled {
		t.Errorf("identity of GPU 3 = %+v", d)
	}
	if !d.HasMemory || d.Memory != (Memory{Total: 100 * GiB, Used: 10 * GiB, Free: 89 * GiB, Reserved: GiB, HasReserved: true}) {
		t.Errorf("memory = %+v, want the v2 figures", d.Memory)
	}
	if len(d.Processes) != 1 || d.Processes[0].PID != 1003 || d.Processes[0].UsedBytes != 4*GiB || d.Processes[0].Name != "proc1003" {
		t.Errorf("processes = %+v", d.Processes)
	}
	if d.Unattributed() != 6*GiB {
		t.Errorf("unattributed = %d, want 6 GiB", d.Unattributed())
	}
	if snap.DriverVersion != "550.54.15" || snap.CUDADriverVersion != "12.4" {
		t.Errorf("driver %q cuda %q", snap.DriverVersion, snap.CUDADriverVersion)
	}
	if !p.Up() || !p.Ready() {
		t.Error("poller not up and ready after a good poll")
	}
}

func TestOnPollHooksSeeEachPublishedSnapshotInTheOrderAdded(t *testing.T) {
	p := NewPoller(Config{Lib: newMockNode()})
	var calls []string
	var seen []*Snapshot
	p.OnPoll(func(s *Snapshot) {
		calls = append(calls, "first")
		seen = append(seen, s)
	})
	p.OnPoll(func(s *Snapshot) {
		calls = append(calls, "second")
		if s != p.Snapshot() {
			t.Error("a hook ran before its snapshot was published")
		}
	})
	first := pollOnce(t, p)
	second := pollOnce(t, p)
	if want := []string{"first", "second", "first", "second"}; strings.Join(calls, " ") != strings.Join(want, " ") {
		t.Errorf("hooks ran as %v, want %v", calls, want)
	}
	if len(seen) != 2 || seen[0] != first || seen[1] != second {
		t.Errorf("the first hook saw %d snapshots, want the two polls' own", len(seen))
	}
}

func TestMemoryFallsBackToV1WithoutCountingTheReservationTwice(t *testing.T) {
	s := newMockNode()
	mockDevice(s, 0).GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		return nvml.Memory_v2{}, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	p := NewPoller(Config{Lib: s})
	for i := 0; i < 2; i++ {
		snap := pollOnce(t, p)
		m := snap.Devices[0].Memory
		if m.HasReserved || m.Used != 11*GiB || m.Total != m.Used+m.Free {
			t.Fatalf("poll %d: v1 memory = %+v, want used 11 GiB and no reserved", i, m)
		}
	}
	if got := testutil.ToFloat64(p.errors.WithLabelValues("GetMemoryInfo_v2")); got != 0 {
		t.Errorf("a missing v2 call counted %v errors, want 0 (it is a fallback, not a failure)", got)
	}
}

func TestFailedCallsDropOnlyWhatFailed(t *testing.T) {
	s := newMockNode()
	mockDevice(s, 1).GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		return nvml.Memory_v2{}, nvml.ERROR_GPU_IS_LOST
	}
	mockDevice(s, 2).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	mockDevice(s, 2).GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	mockDevice(s, 4).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
	p := NewPoller(Config{Lib: s})
	snap := pollOnce(t, p)
	if len(snap.Devices) != 7 {
		t.Fatalf("devices = %d, want 7 (GPU 4 has no UUID and is skipped)", len(snap.Devices))
	}
	d1, _ := snap.Device(testUUID(1))
	if d1.HasMemory || !d1.HasProcesses || len(d1.Processes) != 1 {
		t.Errorf("GPU 1 (memory lost): %+v, want processes but no memory", d1)
	}
	d2, _ := snap.Device(testUUID(2))
	if !d2.HasMemory || d2.HasProcesses {
		t.Errorf("GPU 2 (no process lists): %+v, want memory but no processes", d2)
	}
	for call, want := range map[string]float64{"GetMemoryInfo_v2": 1, "GetComputeRunningProcesses": 1, "GetGraphicsRunningProcesses": 1, "GetUUID": 1} {
		if got := testutil.ToFloat64(p.errors.WithLabelValues(call)); got != want {
			t.Errorf("errors{call=%q} = %v, want %v", call, got, want)
		}
	}
	if !p.Up() {
		t.Error("per-call failures must not take NVML down")
	}
}

func TestProcessUsedNotAvailable(t *testing.T) {
	s := newMockNode()
	mockDevice(s, 0).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 42, UsedGpuMemory: notAvailable}}, nvml.SUCCESS
	}
	snap := pollOnce(t, NewPoller(Config{Lib: s}))
	pr := snap.Devices[0].Processes[0]
	if pr.HasUsed || pr.UsedBytes != 0 {
		t.Errorf("process with NVML_VALUE_NOT_AVAILABLE = %+v, want HasUsed false", pr)
	}
}

func TestComputeAndGraphicsListsMerge(t *testing.T) {
	s := newMockNode()
	mockDevice(s, 0).GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 1000, UsedGpuMemory: 4 * GiB}, {Pid: 5, UsedGpuMemory: 100 * MiB}}, nvml.SUCCESS
	}
	snap := pollOnce(t, NewPoller(Config{Lib: s}))
	procs := snap.Devices[0].Processes
	if len(procs) != 2 || procs[0].PID != 5 || !procs[0].Graphics || procs[0].Compute ||
		procs[1].PID != 1000 || !procs[1].Compute || !procs[1].Graphics || procs[1].UsedBytes != 4*GiB {
		t.Errorf("merged processes = %+v", procs)
	}
}

func TestPeakKeepsTheHighestUsedUntilTheProcessGoes(t *testing.T) {
	s := newMockNode()
	used := []uint64{2 * GiB, 9 * GiB, 3 * GiB, 0, 1 * GiB}
	step := 0
	mockDevice(s, 0).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		if used[step] == 0 {
			return nil, nvml.SUCCESS // the process exited
		}
		return []nvml.ProcessInfo{{Pid: 77, UsedGpuMemory: used[step]}}, nvml.SUCCESS
	}
	p := NewPoller(Config{Lib: s})
	wantPeak := []uint64{2 * GiB, 9 * GiB, 9 * GiB, 0, 1 * GiB}
	for step = range used {
		snap := pollOnce(t, p)
		procs := snap.Devices[0].Processes
		if used[step] == 0 {
			if len(procs) != 0 {
				t.Fatalf("step %d: process still listed", step)
			}
			continue
		}
		if procs[0].PeakBytes != wantPeak[step] {
			t.Errorf("step %d: peak = %d, want %d", step, procs[0].PeakBytes, wantPeak[step])
		}
	}
}

func TestMIGInstancesAreTheirOwnDevices(t *testing.T) {
	s := newMockNode()
	enableMIG(s, 2)
	snap := pollOnce(t, NewPoller(Config{Lib: s}))
	if len(snap.Devices) != 10 {
		t.Fatalf("devices = %d, want 8 GPUs + 2 MIG instances", len(snap.Devices))
	}
	parent := snap.Devices[2]
	if parent.MIGMode != MIGEnabled || parent.ExportsMemory() || parent.HasProcesses {
		t.Errorf("MIG parent = %+v: want mig enabled and no memory or processes of its own", parent)
	}
	mig := snap.Devices[3]
	if !strings.HasPrefix(mig.UUID, "MIG-") || mig.ParentUUID != testUUID(2) || mig.Index != 2 {
		t.Errorf("MIG instance identity = %+v", mig)
	}
	if mig.Memory.Total != 20*GiB || len(mig.Processes) != 1 || mig.Processes[0].PID != 7000 {
		t.Errorf("MIG instance memory/processes = %+v / %+v", mig.Memory, mig.Processes)
	}
	if snap.Devices[4].ParentUUID != testUUID(2) || snap.Devices[5].UUID != testUUID(3) {
		t.Errorf("device order = %s, %s", snap.Devices[4].UUID, snap.Devices[5].UUID)
	}
}

func TestNVMLAbsentAtStartThenPresent(t *testing.T) {
	s := newMockNode()
	var present atomic.Bool
	s.InitFunc = func() nvml.Return {
		if present.Load() {
			return nvml.SUCCESS
		}
		return nvml.ERROR_LIBRARY_NOT_FOUND
	}
	p := NewPoller(Config{Lib: s, Interval: 5 * time.Millisecond, InitBackoffMin: 5 * time.Millisecond, InitBackoffMax: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()

	waitFor(t, func() bool { return p.Snapshot() != nil }, "a first (empty) snapshot")
	if p.Up() || p.Ready() {
		t.Fatal("up or ready without NVML")
	}
	if n := len(p.Snapshot().Devices); n != 0 {
		t.Fatalf("devices without NVML = %d", n)
	}
	present.Store(true)
	waitFor(t, p.Ready, "readiness after NVML appears")
	if !p.Up() || len(p.Snapshot().Devices) != 8 {
		t.Fatalf("after NVML appeared: up=%v devices=%d", p.Up(), len(p.Snapshot().Devices))
	}
	if got := testutil.ToFloat64(p.errors.WithLabelValues("Init")); got < 1 {
		t.Errorf("failed inits counted %v, want >= 1", got)
	}
	cancel()
	<-done
}

func TestDriverGoneReinitialises(t *testing.T) {
	s := newMockNode()
	var inits atomic.Int32
	s.InitFunc = func() nvml.Return { inits.Add(1); return nvml.SUCCESS }
	var lost atomic.Bool
	s.DeviceGetCountFunc = func() (int, nvml.Return) {
		if lost.Load() {
			return 0, nvml.ERROR_UNINITIALIZED
		}
		return 8, nvml.SUCCESS
	}
	p := NewPoller(Config{Lib: s})
	pollOnce(t, p)
	lost.Store(true)
	if err := p.Poll(); err == nil {
		t.Fatal("poll with the driver gone succeeded")
	}
	if p.Up() || len(p.Snapshot().Devices) != 0 {
		t.Fatal("stale devices served while NVML is down")
	}
	lost.Store(false)
	pollOnce(t, p)
	if inits.Load() != 2 {
		t.Errorf("inits = %d, want 2 (NVML initialised again after it went away)", inits.Load())
	}
}

func TestPanickingCallDoesNotKillThePoller(t *testing.T) {
	s := newMockNode()
	mockDevice(s, 0).GetMemoryInfo_v2Func = nil // the mock panics on a nil func
	p := NewPoller(Config{Lib: s})
	if err := p.Poll(); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("poll error = %v, want a recovered panic", err)
	}
	if p.Up() {
		t.Error("up after a panicked poll")
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestAStuckPollTakesNVMLDown(t *testing.T) {
	now := time.Unix(1000, 0)
	p := NewPoller(Config{Lib: newMockNode(), Interval: time.Second, Now: func() time.Time { return now }})
	pollOnce(t, p)
	if !p.Up() {
		t.Fatal("not up after a good poll")
	}
	now = now.Add(p.StaleAfter()) // the next poll is stuck in NVML
	if !p.Up() {
		t.Error("down at exactly StaleAfter")
	}
	now = now.Add(time.Millisecond)
	if p.Up() {
		t.Errorf("still up %s after the last poll; want down once the snapshot is older than %s", p.StaleAfter()+time.Millisecond, p.StaleAfter())
	}
	want := "# HELP gpumem_nvml_up 1 when NVML is initialised and the last poll listed the devices and is recent (within 3 poll intervals and 5 s), else 0.\n# TYPE gpumem_nvml_up gauge\ngpumem_nvml_up 0\n"
	if err := testutil.CollectAndCompare(p, strings.NewReader(want), "gpumem_nvml_up"); err != nil {
		t.Errorf("with a stuck poll: %v", err)
	}
	pollOnce(t, p)
	if !p.Up() {
		t.Error("not up again after the poll completed")
	}
}

// Fresh returns a snapshot of a poll that started after it was called,
// waking Run early instead of waiting out the interval.
func TestFreshPollsNowAndCoalesces(t *testing.T) {
	var polls atomic.Int32
	p := NewPoller(Config{Lib: onEachPoll(newMockNode(), func() { polls.Add(1) }), Interval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for polls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Run never polled")
		}
		time.Sleep(time.Millisecond)
	}
	first := p.Snapshot()
	fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
	defer fcancel()
	snap, err := p.Fresh(fctx)
	if err != nil {
		t.Fatalf("Fresh with an hour's interval: %v (Run was not woken)", err)
	}
	if snap == first {
		t.Error("Fresh returned the snapshot it was called with, not a new one")
	}
	if n := polls.Load(); n != 2 {
		t.Errorf("%d polls after one Fresh, want 2", n)
	}
}

func TestFreshWithoutRunReturnsTheLatestAndTheDeadline(t *testing.T) {
	p := NewPoller(Config{Lib: newMockNode()})
	if err := p.Poll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	snap, err := p.Fresh(ctx)
	if err == nil || snap != p.Snapshot() {
		t.Errorf("Fresh without Run = %p, %v; want the latest snapshot and the context's error", snap, err)
	}
}

// Run polls on the grid of its interval (whole multiples since the Unix
// epoch), which the allocator socket's check shares, so an idle daemon
// wakes once per interval for both. Timers only ever fire late, so each
// poll after the first starts a little after a multiple of the interval.
func TestRunPollsOnTheGridOfTheInterval(t *testing.T) {
	const interval = 300 * time.Millisecond
	var mu sync.Mutex
	var starts []time.Time
	p := NewPoller(Config{Lib: onEachPoll(newMockNode(), func() {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
	}), Interval: interval})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(starts)
		mu.Unlock()
		if n >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d polls in 10 s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	for i, at := range starts[1:4] {
		if late := time.Duration(at.UnixNano() % int64(interval)); late > interval/3 {
			t.Errorf("poll %d started %s after a multiple of the interval, want under %s", i+2, late, interval/3)
		}
		if gap := at.Sub(starts[i]); gap < interval/2 {
			t.Errorf("poll %d started %s after the one before, want at least half the interval", i+2, gap)
		}
	}
}
