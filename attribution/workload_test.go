package attribution

import (
	"testing"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/workload"
)

func TestWorkloadNamesPodThenSlurmJobThenProcess(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  Row
		want string
	}{
		{"pod", Row{PID: 7, Info: workload.Info{Namespace: "ml", Pod: "train-0", SlurmJobID: "12"}}, "ml/train-0"},
		{"aggregated pod row", Row{Info: workload.Info{Namespace: "ml", Pod: "train-0"}}, "ml/train-0"},
		{"slurm job", Row{PID: 7, Info: workload.Info{SlurmJobID: "4242"}}, "slurm job 4242"},
		{"container whose pod is not known yet", Row{PID: 7, Info: workload.Info{PodUID: "u1", ContainerID: "abc"}}, "node-a pid 7"},
		{"plain process", Row{PID: 1234}, "node-a pid 1234"},
	} {
		if got := tc.row.Workload("node-a"); got != tc.want {
			t.Errorf("%s: Workload = %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := (&Row{PID: 1234}).Workload(""); got != "pid 1234" {
		t.Errorf("Workload without a node name = %q, want \"pid 1234\"", got)
	}
}

func TestCapacityIsTheLimitOrReservedPlusFree(t *testing.T) {
	const gib = 1 << 30
	stats := func(reserved uint64, limit allocstats.Optional) *allocstats.DeviceStats {
		return &allocstats.DeviceStats{Reserved: reserved, Limit: limit}
	}
	for _, tc := range []struct {
		name      string
		row       Row
		free      uint64
		freeKnown bool
		want      uint64
		ok        bool
	}{
		{"no limit: reserved + free", Row{Alloc: stats(10*gib, allocstats.Optional{})}, 30 * gib, true, 40 * gib, true},
		{"a smaller limit", Row{Alloc: stats(10*gib, allocstats.Some(20*gib))}, 30 * gib, true, 20 * gib, true},
		{"a limit above what the GPU has", Row{Alloc: stats(10*gib, allocstats.Some(100*gib))}, 30 * gib, true, 40 * gib, true},
		{"a zero limit is none", Row{Alloc: stats(10*gib, allocstats.Some(0))}, 30 * gib, true, 40 * gib, true},
		{"free unknown, a limit", Row{Alloc: stats(10*gib, allocstats.Some(20*gib))}, 0, false, 20 * gib, true},
		{"free unknown, no limit", Row{Alloc: stats(10*gib, allocstats.Optional{})}, 0, false, 0, false},
		{"no allocator state", Row{}, 30 * gib, true, 0, false},
		{"exited", Row{Alloc: stats(0, allocstats.Some(20*gib)), Exited: true}, 30 * gib, true, 0, false},
	} {
		got, ok := tc.row.Capacity(tc.free, tc.freeKnown)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: Capacity = %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
