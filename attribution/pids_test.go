package attribution

import (
	"slices"
	"testing"

	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// The workload cache resolves every pid NVML lists and every pid that
// reports, each once.
func TestPIDsToLabelAreNVMLsAndTheReportersOnce(t *testing.T) {
	snap := &nvmlpoll.Snapshot{Devices: []nvmlpoll.Device{
		{UUID: "GPU-a", Processes: []nvmlpoll.Process{{PID: 1}, {PID: 2}}},
		{UUID: "GPU-b", Processes: []nvmlpoll.Process{{PID: 2}, {PID: 3}}},
	}}
	got := PIDsToLabel(snap, []uint32{3, 4, 4})
	slices.Sort(got)
	if want := []uint32{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Errorf("PIDsToLabel = %v, want %v", got, want)
	}
	if got := PIDsToLabel(nil, []uint32{5}); !slices.Equal(got, []uint32{5}) {
		t.Errorf("before the first poll PIDsToLabel = %v, want the reporters [5]", got)
	}
}
