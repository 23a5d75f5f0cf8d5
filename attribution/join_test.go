package attribution

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-kit/log"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/internal/mocknode"
	"github.com/gpumem/gpumem_exporter/internal/procfixture"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/workload"
)

// joinSnapshot has GPU 0 listing pid 10 (named "nvml-name" by NVML), GPU 1
// in MIG mode and its instance listing pid 20.
func joinSnapshot() *nvmlpoll.Snapshot {
	return &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{
		{Index: 0, UUID: gpuUUID(0), MIGMode: nvmlpoll.MIGDisabled, HasMemory: true, HasProcesses: true,
			Processes: []nvmlpoll.Process{{PID: 10, HasUsed: true, UsedBytes: 5 * GiB, Name: "nvml-name"}}},
		{Index: 1, UUID: gpuUUID(1), MIGMode: nvmlpoll.MIGEnabled},
		{Index: 1, UUID: migUUID(1, 0), ParentUUID: gpuUUID(1), HasMemory: true, HasProcesses: true,
			Processes: []nvmlpoll.Process{{PID: 20, HasUsed: true, UsedBytes: 3 * GiB}}},
	}}
}

func allocProc(pid uint32, start uint64, uuid string) allocstats.Process {
	return allocstats.Process{PID: pid, StartTime: start, Framework: "pytorch",
		Devices: []allocstats.DeviceStats{{UUID: uuid, HasStats: true, Reserved: 1 * GiB}}}
}

// rowKey names a row for the tests: "pid@uuid", "+alloc" when joined.
func rowKeys(rows []Row) []string {
	var out []string
	for _, r := range rows {
		k := fmt.Sprintf("%d@%s", r.PID, r.UUID)
		if r.Alloc != nil {
			k += "+alloc"
		}
		out = append(out, k)
	}
	return out
}

func TestJoinProcesses(t *testing.T) {
	g0, mig := gpuUUID(0), migUUID(1, 0)
	cases := []struct {
		name     string
		procs    []allocstats.Process
		resolver fakeResolver
		want     []string
	}{
		{"no allocator reports", nil, nil, []string{"10@" + g0, "20@" + mig}},
		{"same start time joins", []allocstats.Process{allocProc(10, 500, g0)}, fakeResolver{10: {StartTime: 500}},
			[]string{"10@" + g0 + "+alloc", "20@" + mig}},
		{"a report from an earlier holder of the pid is not joined nor kept", []allocstats.Process{allocProc(10, 500, g0)}, fakeResolver{10: {StartTime: 900}},
			[]string{"10@" + g0, "20@" + mig}},
		{"an unknown live start time joins", []allocstats.Process{allocProc(10, 500, g0)}, fakeResolver{10: {Comm: "x"}},
			[]string{"10@" + g0 + "+alloc", "20@" + mig}},
		{"an unknown report start time joins", []allocstats.Process{allocProc(10, 0, g0)}, fakeResolver{10: {StartTime: 900}},
			[]string{"10@" + g0 + "+alloc", "20@" + mig}},
		{"an allocator-only process is kept", []allocstats.Process{allocProc(30, 500, g0)}, fakeResolver{30: {StartTime: 500}},
			[]string{"10@" + g0, "30@" + g0 + "+alloc", "20@" + mig}},
		{"an allocator-only report of an earlier holder of the pid is dropped", []allocstats.Process{allocProc(30, 500, g0)}, fakeResolver{30: {StartTime: 900}},
			[]string{"10@" + g0, "20@" + mig}},
		{"a report on a MIG instance joins there", []allocstats.Process{allocProc(20, 0, mig)}, nil,
			[]string{"10@" + g0, "20@" + mig + "+alloc"}},
		{"a device NVML no longer lists takes its report with it", []allocstats.Process{allocProc(30, 0, gpuUUID(7))}, nil,
			[]string{"10@" + g0, "20@" + mig}},
		{"an oom message alone is no allocator state", []allocstats.Process{{PID: 10, Devices: []allocstats.DeviceStats{{UUID: g0, LastOOMRequest: allocstats.Some(1)}}}}, nil,
			[]string{"10@" + g0, "20@" + mig}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rows := Join(joinSnapshot(), tc.procs, tc.resolver)
			if got := rowKeys(rows); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("rows = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestJoinCommFallsBackToNVMLName(t *testing.T) {
	for _, tc := range []struct {
		name     string
		resolver fakeResolver
		want     string
	}{
		{"resolver knows the comm", fakeResolver{10: {Comm: "python3"}}, "python3"},
		{"resolver knows the pid but not its comm", fakeResolver{10: {Namespace: "ml"}}, "nvml-name"},
		{"resolver does not know the pid", nil, "nvml-name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := Join(joinSnapshot(), nil, tc.resolver)
			if rows[0].PID != 10 || rows[0].Comm != tc.want {
				t.Errorf("comm of pid 10 = %q, want %q", rows[0].Comm, tc.want)
			}
		})
	}
}

func TestJoinWithoutSnapshotExportsNoAllocatorRows(t *testing.T) {
	rows := Join(nil, []allocstats.Process{allocProc(30, 0, gpuUUID(0))}, nil)
	if len(rows) != 0 {
		t.Errorf("rows without an NVML snapshot = %v, want none: no device to label them with", rowKeys(rows))
	}
}

// A MIG-mode parent exports only gpu_info (its memory is its instances'),
// so a report naming the parent must not bring process series onto it.
func TestJoinKeepsAllocatorRowsOffTheMIGParent(t *testing.T) {
	rows := Join(joinSnapshot(), []allocstats.Process{allocProc(40, 0, gpuUUID(1))}, nil)
	for _, r := range rows {
		if r.UUID == gpuUUID(1) {
			t.Errorf("row %d@%s on the MIG-mode parent: its series would sit beside its instances' and sum() would count them twice", r.PID, r.UUID)
		}
	}
}

// CUDA names a MIG instance by the same 16 bytes that NVML spells MIG-…,
// and clients can only prefix them with GPU- (nvmlpoll.Snapshot.Device). The
// join matches allocator-only reports by that body; the NVML join must
// too, or the process gets two rows on the instance: NVML's without its
// allocator stats (so no context_bytes) and an "allocator-only" one, hence
// two gpumem_process_info series for one (pid, uuid).
func TestJoinMatchesAMIGReportSpelledGPU(t *testing.T) {
	mig := migUUID(1, 0)
	spelledGPU := "GPU-" + mig[len("MIG-"):]
	rows := Join(joinSnapshot(), []allocstats.Process{allocProc(20, 0, spelledGPU)}, nil)
	want := []string{"10@" + gpuUUID(0), "20@" + mig + "+alloc"}
	if got := rowKeys(rows); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("rows = %v, want %v", got, want)
	}
}

// TestPidReuseGuardOverTheSocket drives the guard end to end: this test
// process reports over a real allocstats socket, the server records the
// start time X its procfs gives, NVML lists this pid, and the
// resolver says the live pid started at Y.
func TestPidReuseGuardOverTheSocket(t *testing.T) {
	const reportedStart = 111
	pid := uint32(os.Getpid())
	store := reportOverSocket(t, pid, reportedStart)
	listed := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{{Index: 0, UUID: gpuUUID(0), HasMemory: true, HasProcesses: true,
		Processes: []nvmlpoll.Process{{PID: pid, HasUsed: true, UsedBytes: 4 * GiB}}}}}
	unlisted := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{{Index: 0, UUID: gpuUUID(0), HasMemory: true, HasProcesses: true}}}
	for _, tc := range []struct {
		name      string
		snap      *nvmlpoll.Snapshot
		liveStart uint64
		want      []string
	}{
		{"same process", listed, reportedStart, []string{fmt.Sprintf("%d@%s+alloc", pid, gpuUUID(0))}},
		{"pid reused since the report", listed, 222, []string{fmt.Sprintf("%d@%s", pid, gpuUUID(0))}},
		{"live start time unknown", listed, 0, []string{fmt.Sprintf("%d@%s+alloc", pid, gpuUUID(0))}},
		{"a stale report of a pid NVML does not list is not kept either", unlisted, 222, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := Sources{NVML: fixedSnapshot{tc.snap}, Allocator: store, Workload: fakeResolver{pid: {StartTime: tc.liveStart, Comm: "go-test"}}}
			rows := src.Read().Rows
			if got := rowKeys(rows); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("live start %d, reported %d: rows = %v, want %v", tc.liveStart, reportedStart, got, tc.want)
			}
			for _, r := range rows {
				if _, ok := r.Context(); ok != (r.Alloc != nil) {
					t.Errorf("row %d@%s: context known = %v with allocator stats %v", r.PID, r.UUID, ok, r.Alloc != nil)
				}
			}
		})
	}
}

type fixedSnapshot struct{ s *nvmlpoll.Snapshot }

func (f fixedSnapshot) Snapshot() *nvmlpoll.Snapshot { return f.s }

// fakeResolver is a workload cache over a fixed map.
type fakeResolver map[uint32]workload.Info

func (r fakeResolver) Lookup(pid uint32) (workload.Info, bool) {
	in, ok := r[pid]
	if ok {
		in.PID = pid
	}
	return in, ok
}

var (
	gpuUUID = mocknode.GPUUUID
	migUUID = mocknode.MIGUUID
)

const GiB = mocknode.GiB

// reportOverSocket serves a store on a temporary socket whose procfs says
// this process started at start, and pushes a hello and one stats message from this
// process for GPU 0.
func reportOverSocket(t *testing.T, pid uint32, start uint64) *allocstats.Store {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpumem")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	procPath := filepath.Join(dir, "proc")
	procfixture.Write(t, procPath, pid, procfixture.Process{Comm: "go-test", Start: start, UID: strconv.Itoa(os.Geteuid())})
	store := allocstats.NewStore(time.Hour)
	srv, err := allocstats.NewServer(allocstats.Config{
		SocketPath:     filepath.Join(dir, "s.sock"),
		SocketExplicit: true,
		ProcPath:       procPath,
	}, store, log.NewNopLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatalf("listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	c, err := net.Dial("unix", srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, `{"v":1,"type":"hello","framework":"pytorch"}`+"\n")
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatalf("reading welcome: %v", err)
	}
	fmt.Fprintf(c, `{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%d,"active_bytes":%d}]}`+"\n", gpuUUID(0), 3*GiB, 2*GiB)

	deadline := time.Now().Add(5 * time.Second)
	for {
		if p, ok := store.Process(pid); ok && len(p.Devices) == 1 && p.Devices[0].HasStats {
			if p.StartTime != start {
				t.Fatalf("store entry start time = %d, want %d from the server's procfs", p.StartTime, start)
			}
			return store
		}
		if time.Now().After(deadline) {
			t.Fatal("the stats message never reached the store")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ Lookup = fakeResolver(nil)

// TestSettleLabelsHoldsBackUnresolvedProcesses: a process the workload
// cache has not resolved yet is not exported at all, rather than exported
// with empty labels that change at the next refresh.
func TestSettleLabelsHoldsBackUnresolvedProcesses(t *testing.T) {
	g0, mig := gpuUUID(0), migUUID(1, 0)
	// pid 10 is resolved; 20 (listed by NVML) and 30 (a new reporting
	// process) are not yet.
	store := allocstats.NewStore(time.Minute)
	if err := allocstatstest.Report(store, allocstats.Identity{PID: 30, StartTime: 1}, "pytorch", []allocstats.DeviceReport{{UUID: g0, Reserved: GiB}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	cache := fakeResolver{10: {StartTime: 1, Comm: "python3"}}
	for _, tc := range []struct {
		settle bool
		want   []string
	}{
		{false, []string{"10@" + g0, "30@" + g0 + "+alloc", "20@" + mig}},
		{true, []string{"10@" + g0}},
	} {
		src := Sources{NVML: fixedSnapshot{joinSnapshot()}, Allocator: store, Workload: cache, SettleLabels: tc.settle}
		if got := rowKeys(src.Read().Rows); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("SettleLabels=%v: rows %v, want %v", tc.settle, got, tc.want)
		}
	}
}
