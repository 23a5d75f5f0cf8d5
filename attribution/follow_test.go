package attribution

import (
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/allocstats/allocstatstest"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// countingStore is the allocator store, counting the joins that read it.
type countingStore struct {
	*allocstats.Store
	reads int
}

func (c *countingStore) Processes() []allocstats.Process { c.reads++; return c.Store.Processes() }

// allocatorOnly hides every method but Processes (no Version).
type allocatorOnly struct{ s *countingStore }

func (a allocatorOnly) Processes() []allocstats.Process { return a.s.Processes() }

// lastView keeps the last view it was handed.
type lastView struct {
	views int
	last  View
}

func (l *lastView) ObserveView(v View) { l.views++; l.last = v }

// The Follower runs after every poll; on an idle node nothing it joins
// changes, so it joins again only when NVML's readings or the allocator
// store changed, or followRefresh after its last join.
func TestFollowerJoinsOnlyWhenItsInputsChanged(t *testing.T) {
	const uuid = "GPU-00000000-0000-0000-0000-000000000003"
	const mib = 1 << 20
	t0 := time.Unix(1_700_000_000, 0)
	snapAt := func(at time.Time, used uint64) *nvmlpoll.Snapshot {
		return &nvmlpoll.Snapshot{Time: at, Devices: []nvmlpoll.Device{{
			Index: 3, UUID: uuid, HasMemory: true, HasProcesses: true,
			Memory:    nvmlpoll.Memory{Total: 143771 * mib, Used: used, Free: 143771*mib - used},
			Processes: []nvmlpoll.Process{{PID: 100, HasUsed: true, UsedBytes: used}},
		}}}
	}
	report := func(s *allocstats.Store, reserved uint64) {
		t.Helper()
		if err := allocstatstest.Report(s, allocstats.Identity{PID: 100, StartTime: 1}, "", []allocstats.DeviceReport{{UUID: uuid, Reserved: reserved}}, t0); err != nil {
			t.Fatal(err)
		}
	}
	store := &countingStore{Store: allocstats.NewStore(time.Minute)}
	report(store.Store, 1000*mib)
	obs := &lastView{}
	f := NewFollower(Sources{Allocator: store}, obs)
	context := func() uint64 {
		for _, r := range obs.last.Rows {
			if c, ok := r.Context(); ok {
				return c
			}
		}
		return 0
	}
	step := func(what string, snap *nvmlpoll.Snapshot, wantReads int, wantContext uint64) {
		t.Helper()
		f.Observe(snap)
		if store.reads != wantReads || obs.views != wantReads || context() != wantContext {
			t.Errorf("%s: %d joins, %d views, context %d MiB; want %d joins and views, context %d MiB", what, store.reads, obs.views, context()/mib, wantReads, wantContext/mib)
		}
	}
	step("first poll", snapAt(t0, 1520*mib), 1, 520*mib)
	step("the same readings a second later", snapAt(t0.Add(time.Second), 1520*mib), 1, 520*mib)
	report(store.Store, 1100*mib)
	step("a stats line since", snapAt(t0.Add(2*time.Second), 1520*mib), 2, 420*mib)
	step("NVML's used moved", snapAt(t0.Add(3*time.Second), 1630*mib), 3, 530*mib)
	step("nothing moved", snapAt(t0.Add(4*time.Second), 1630*mib), 3, 530*mib)
	f.at = f.at.Add(-followRefresh)
	step("nothing moved, followRefresh after the last join", snapAt(t0.Add(5*time.Second), 1630*mib), 4, 530*mib)

	// A source without a version is joined at every poll.
	plain := NewFollower(Sources{Allocator: allocatorOnly{store}}, obs)
	reads := store.reads
	plain.Observe(snapAt(t0, 1630*mib))
	plain.Observe(snapAt(t0, 1630*mib))
	if store.reads != reads+2 {
		t.Errorf("an allocator source without Version: %d joins for 2 polls, want 2", store.reads-reads)
	}
}
