package nvmlpoll

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// listCalls counts the process-list calls among the calls since before.
func listCalls(c callCounter, before map[string]int) (compute, graphics int) {
	got := c.since(before)
	return got["GetComputeRunningProcesses"], got["GetGraphicsRunningProcesses"]
}

// With Config.ProcessRefresh, a device's process lists are read again only
// when its memory figures changed, when they are older than ProcessRefresh,
// when Fresh asked for the poll, or after a failed call; the snapshot is
// the same as a read would give.
func TestProcessListsReusedWhileMemoryIsUnchanged(t *testing.T) {
	s := newMockNode()
	calls := callCounter{s: s}
	now := time.Unix(1000, 0)
	p := NewPoller(Config{Lib: s, Now: func() time.Time { return now }, ProcessRefresh: 10 * time.Second})
	every := NewPoller(Config{Lib: s, Now: func() time.Time { return now }}) // reads every poll: the reference

	step := func(what string, wantLists int) {
		t.Helper()
		now = now.Add(time.Second)
		before := calls.counts()
		snap := pollOnce(t, p)
		compute, graphics := listCalls(calls, before)
		if compute != wantLists || graphics != wantLists {
			t.Errorf("%s: %d compute and %d graphics list calls, want %d of each", what, compute, graphics, wantLists)
		}
		if mem := calls.since(before)["GetMemoryInfo_v2"]; mem != 8 {
			t.Errorf("%s: %d memory calls, want 8 (every device, every poll)", what, mem)
		}
		ref := pollOnce(t, every)
		for i := range ref.Devices {
			if !reflect.DeepEqual(snap.Devices[i], ref.Devices[i]) {
				t.Errorf("%s: device %d is\n%+v\nwhere a read of every list gives\n%+v", what, i, snap.Devices[i], ref.Devices[i])
			}
		}
	}

	step("first poll", 8)
	for i := 0; i < 5; i++ {
		step("memory unchanged", 0)
	}

	// A process on GPU 3 allocates: its memory figures change, and only its
	// lists are read again.
	d3 := mockDevice(s, 3)
	d3.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		return nvml.Memory_v2{Total: 100 * GiB, Reserved: 1 * GiB, Used: 12 * GiB, Free: 87 * GiB}, nvml.SUCCESS
	}
	d3.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 1003, UsedGpuMemory: 6 * GiB}}, nvml.SUCCESS
	}
	step("GPU 3's memory changed", 1)
	step("memory unchanged again", 0)
	if got := p.Snapshot().Devices[3].Processes[0]; got.UsedBytes != 6*GiB || got.PeakBytes != 6*GiB {
		t.Errorf("GPU 3's process after it allocated: %+v, want 6 GiB used and peak", got)
	}

	// ProcessRefresh after the last read, every list is read again.
	now = now.Add(8 * time.Second)
	step("ProcessRefresh elapsed", 8)
	step("memory unchanged", 0)

	// A poll that Fresh asked for reads every list.
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Fresh returns at once; the poll it asked for is the next one
	if _, err := p.Fresh(ctx); err == nil {
		t.Fatal("Fresh with a cancelled context and no Run returned no error")
	}
	step("poll asked for by Fresh", 8)
	step("memory unchanged", 0)

	// A failed list call: the next poll reads every list.
	good := d3.GetGraphicsRunningProcessesFunc
	d3.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
	d3.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		return nvml.Memory_v2{Total: 100 * GiB, Reserved: 1 * GiB, Used: 13 * GiB, Free: 86 * GiB}, nvml.SUCCESS
	}
	now = now.Add(time.Second)
	before := calls.counts()
	pollOnce(t, p)
	if _, graphics := listCalls(calls, before); graphics != 1 {
		t.Errorf("GPU 3's memory changed: %d graphics list calls, want 1", graphics)
	}
	d3.GetGraphicsRunningProcessesFunc = good
	step("after a failed list call", 8)
	step("memory unchanged", 0)

	// A failed memory call: nothing to compare, that device's lists are
	// read; then the next poll reads every list.
	d5 := mockDevice(s, 5)
	goodMem := d5.GetMemoryInfo_v2Func
	d5.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_UNKNOWN }
	now = now.Add(time.Second)
	before = calls.counts()
	snap := pollOnce(t, p)
	if compute, _ := listCalls(calls, before); compute != 1 {
		t.Errorf("poll with GPU 5's memory call failing: %d compute list calls, want 1", compute)
	}
	if d := snap.Devices[5]; d.HasMemory || !d.HasProcesses {
		t.Errorf("GPU 5 with its memory call failing: HasMemory %v, HasProcesses %v; want false, true", d.HasMemory, d.HasProcesses)
	}
	d5.GetMemoryInfo_v2Func = goodMem
	step("after a failed memory call", 8)
	step("memory unchanged", 0)
}

// The snapshots' process slices are their own: a reused list is copied.
func TestReusedProcessListsAreNotShared(t *testing.T) {
	s := newMockNode()
	now := time.Unix(1000, 0)
	p := NewPoller(Config{Lib: s, Now: func() time.Time { return now }, ProcessRefresh: time.Minute})
	first := pollOnce(t, p)
	now = now.Add(time.Second)
	second := pollOnce(t, p)
	a, b := first.Devices[2].Processes, second.Devices[2].Processes
	if len(a) != 1 || len(b) != 1 || &a[0] == &b[0] {
		t.Fatalf("two snapshots share a process slice (or lack one): %p %p", a, b)
	}
}

// Without ProcessRefresh (0, the Config's default) every poll reads every
// list.
func TestProcessListsReadEveryPollByDefault(t *testing.T) {
	s := newMockNode()
	calls := callCounter{s: s}
	p := NewPoller(Config{Lib: s})
	pollOnce(t, p)
	before := calls.counts()
	for i := 0; i < 3; i++ {
		pollOnce(t, p)
	}
	if compute, graphics := listCalls(calls, before); compute != 24 || graphics != 24 {
		t.Errorf("3 polls of 8 GPUs: %d compute and %d graphics list calls, want 24 of each", compute, graphics)
	}
}
