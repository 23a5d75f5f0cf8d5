package collector

import (
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/workload"
)

// With --collector.process.aggregate=pod, the processes of one container
// on one GPU are one series each family, pid and comm empty; processes
// outside a pod keep theirs; counters do not go down when a process
// leaves.
func TestAggregatePerPod(t *testing.T) {
	node := twoGPUNode() // GPU 0: pid 1000 (12 GiB) and 1001 (8 GiB); GPU 1: pid 1100 (6 GiB)
	p := newPoller(t, node)
	store := allocstats.NewStore(time.Hour)
	mustReport(store, 1000, "pytorch", []allocstats.DeviceReport{fullReport(gpuUUID(0), 10*GiB, 7*GiB)}, t0)
	mustReport(store, 1001, "pytorch", []allocstats.DeviceReport{fullReport(gpuUUID(0), 4*GiB, 3*GiB)}, t0.Add(1e9))
	inPod := func(pid uint32, start uint64) workload.Info {
		return workload.Info{PID: pid, StartTime: start, Comm: "python3", UID: "1000", Namespace: "ml", Pod: "train-0", Container: "trainer",
			PodUID: "5e1c7a43-0d7c-4f0e-9a51-6f1d2c3b4a59", ContainerID: "cri-0123abcd"}
	}
	resolver := fakeResolver{1000: inPod(1000, 1), 1001: inPod(1001, 1), 1100: {Comm: "blender"}}
	src := sources(p, store, resolver)
	src.Join.Forecasts = forecasts{1000: 300, 1001: 120}
	exp, err := New(src, log.NewNopLogger(), Names()...)
	if err != nil {
		t.Fatal(err)
	}
	exp.aggregate = AggregatePod
	reg := prometheus.NewRegistry()
	reg.MustRegister(exp)
	container := []string{"gpu", "0", "pid", "", "comm", "", "namespace", "ml", "pod", "train-0", "container", "trainer"}

	s := gather(t, reg)
	for name, want := range map[string]float64{
		"gpumem_process_memory_used_bytes":               gib(20),
		"gpumem_process_context_bytes":                   gib(6), // 20 used - 14 reserved
		"gpumem_allocator_reserved_bytes":                gib(14),
		"gpumem_allocator_active_bytes":                  gib(10),
		"gpumem_allocator_inactive_bytes":                gib(4),
		"gpumem_allocator_limit_bytes":                   gib(80),
		"gpumem_allocator_ooms_total":                    2,
		"gpumem_allocator_alloc_retries_total":           6,
		"gpumem_allocator_last_report_timestamp_seconds": float64(t0.Unix() + 1),
		"gpumem_process_info":                            1,
		"gpumem_allocator_time_to_oom_seconds":           120, // its first process to run out
	} {
		if got := one(t, s, name, container...); got != want {
			t.Errorf("%s of the container = %v, want %v", name, got, want)
		}
	}
	if info := find(s, "gpumem_process_info", container...); len(info) == 1 {
		for k, want := range map[string]string{"uid": "1000", "framework": "pytorch", "container_id": "cri-0123abcd"} {
			if got := info[0].labels[k]; got != want {
				t.Errorf("process_info of the container: %s=%q, want %q (every member agrees)", k, got, want)
			}
		}
	}
	for _, pid := range []string{"1000", "1001"} {
		if n := len(find(s, "gpumem_process_memory_used_bytes", "pid", pid)); n != 0 {
			t.Errorf("pid %s of a pod still has %d series of its own", pid, n)
		}
	}
	if got := one(t, s, "gpumem_process_memory_used_bytes", "pid", "1100", "comm", "blender"); got != gib(6) {
		t.Errorf("the process outside a pod: used %v, want its own 6 GiB", got)
	}
	compareText(t, exp, reg)

	// pid 1001 exits: the container's sums drop, its counters do not.
	node.SetUsed(0, 2*GiB, proc(1000, 12*GiB))
	allocstatstest.Exit(store, 1001, t0.Add(2*time.Second))
	if err := p.Poll(); err != nil {
		t.Fatal(err)
	}
	s = gather(t, reg)
	for name, want := range map[string]float64{
		"gpumem_process_memory_used_bytes":     gib(12),
		"gpumem_allocator_reserved_bytes":      gib(10),
		"gpumem_allocator_ooms_total":          2,
		"gpumem_allocator_alloc_retries_total": 6,
	} {
		if got := one(t, s, name, container...); got != want {
			t.Errorf("after a process left the container: %s = %v, want %v", name, got, want)
		}
	}
	compareText(t, exp, reg)
}

// forecasts foresees an OOM of some pids in so many seconds.
type forecasts map[uint32]uint64

func (f forecasts) TimeToOOM(pid uint32, _ uint64, _ string) (uint64, bool) {
	s, ok := f[pid]
	return s, ok
}

// Members that disagree leave a label empty rather than flip between
// their values; a pid reused by a new process in the container counts
// its counters on top of the old one's.
func TestAggregateMembersThatDisagree(t *testing.T) {
	a := newAggregator()
	row := func(pid uint32, start uint64, uid string, ooms uint64) rowSpec {
		return rowSpec{pid, start, uid, ooms}
	}
	first := a.aggregate(podRows(row(1, 10, "1000", 1), row(2, 20, "1001", 0)))
	if len(first) != 1 || first[0].Info.UID != "" || first[0].Alloc.OOMs.V != 1 {
		t.Fatalf("first aggregation = %+v, want one row, uid empty, 1 OOM", first)
	}
	// pid 1 is reused by a new process (start 11) whose counter starts
	// again at 0, then reaches 1.
	again := a.aggregate(podRows(row(1, 11, "1000", 1), row(2, 20, "1001", 0)))
	if got := again[0].Alloc.OOMs.V; got != 2 {
		t.Errorf("OOMs after the pid was reused and the new process ran out of memory once = %d, want 2", got)
	}
	if same := a.aggregate(podRows(row(1, 11, "1000", 1), row(2, 20, "1001", 0))); same[0].Alloc.OOMs.V != 2 {
		t.Errorf("aggregating the same rows again changed the counter to %d", same[0].Alloc.OOMs.V)
	}
}

type rowSpec struct {
	pid   uint32
	start uint64
	uid   string
	ooms  uint64
}

func podRows(specs ...rowSpec) []attribution.Row {
	var rows []attribution.Row
	for _, s := range specs {
		rows = append(rows, attribution.Row{
			GPU: "0", UUID: gpuUUID(0), PID: s.pid,
			Info:  workload.Info{PID: s.pid, StartTime: s.start, UID: s.uid, Namespace: "ml", Pod: "p", Container: "c"},
			Alloc: &allocstats.DeviceStats{UUID: gpuUUID(0), HasStats: true, Reserved: GiB, OOMs: allocstats.Some(s.ooms)},
		})
	}
	return rows
}
