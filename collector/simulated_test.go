package collector

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/simulate"
)

// simulatedNode wires the simulated node as main does: each poll steps
// the node, whose processes report to a store, and prunes the store.
func simulatedNode(t testing.TB, processesPerGPU int) (*nvmlpoll.Poller, *simulate.Node, *allocstats.Store) {
	t.Helper()
	store := allocstats.NewStore(time.Minute)
	sim, err := simulate.New(simulate.Config{Seed: 1, ProcessesPerGPU: processesPerGPU, Open: simulate.Sessions(store)})
	if err != nil {
		t.Fatal(err)
	}
	p := pruneOnPoll(nvmlpoll.NewPoller(nvmlpoll.Config{Lib: sim.Advancing()}), store, sim)
	return p, sim, store
}

// pruneOnPoll has each poll of p drop from store the simulated processes
// that exited, as main's poll hook does, and returns p.
func pruneOnPoll(p *nvmlpoll.Poller, store *allocstats.Store, sim *simulate.Node) *nvmlpoll.Poller {
	p.OnPoll(func(*nvmlpoll.Snapshot) {
		store.Prune(time.Now(), func(pid uint32, start uint64) bool { alive, _ := sim.Alive(pid, start); return alive })
	})
	return p
}

// TestSimulatedNodeMemoryAddsUp checks the gathered values, not the
// snapshot, over 200 steps of the scripted node: each GPU's total is free +
// used + reserved, its used covers its processes, and each reporting
// process's used is its context plus its allocator's reserved.
func TestSimulatedNodeMemoryAddsUp(t *testing.T) {
	p, _, store := simulatedNode(t, 4)
	reg := newRegistry(t, sources(p, store, nil))
	joined := 0
	for step := 1; step <= 200; step++ {
		if err := p.Poll(); err != nil {
			t.Fatalf("step %d: poll: %v", step, err)
		}
		s := gather(t, reg)
		totals := find(s, "gpumem_gpu_memory_total_bytes")
		if len(totals) != 8 {
			t.Fatalf("step %d: %d GPUs with a total, want 8", step, len(totals))
		}
		for _, tot := range totals {
			uuid := tot.labels["uuid"]
			free := one(t, s, "gpumem_gpu_memory_free_bytes", "uuid", uuid)
			used := one(t, s, "gpumem_gpu_memory_used_bytes", "uuid", uuid)
			reserved := one(t, s, "gpumem_gpu_memory_reserved_bytes", "uuid", uuid)
			if tot.value != free+used+reserved {
				t.Errorf("step %d, %s: total %v != free %v + used %v + reserved %v", step, uuid, tot.value, free, used, reserved)
			}
			var sum float64
			for _, pu := range find(s, "gpumem_process_memory_used_bytes", "uuid", uuid) {
				sum += pu.value
			}
			if used < sum {
				t.Errorf("step %d, %s: used %v < the sum of its processes' used %v", step, uuid, used, sum)
			}
			if un := one(t, s, "gpumem_gpu_memory_unattributed_bytes", "uuid", uuid); un != used-sum {
				t.Errorf("step %d, %s: unattributed %v, want used - processes = %v", step, uuid, un, used-sum)
			}
		}
		for _, r := range find(s, "gpumem_allocator_reserved_bytes") {
			pid, uuid := r.labels["pid"], r.labels["uuid"]
			used := find(s, "gpumem_process_memory_used_bytes", "pid", pid, "uuid", uuid)
			if len(used) != 1 {
				t.Errorf("step %d: pid %s reports allocator stats on %s but has %d used series (every simulated process is listed by NVML)", step, pid, uuid, len(used))
				continue
			}
			ctx := one(t, s, "gpumem_process_context_bytes", "pid", pid, "uuid", uuid)
			if ctx+r.value != used[0].value {
				t.Errorf("step %d, pid %s on %s: context %v + allocator reserved %v != used %v", step, pid, uuid, ctx, r.value, used[0].value)
			}
			joined++
		}
		if t.Failed() {
			t.FailNow() // one step's failures say enough
		}
	}
	if joined < 200*8 {
		t.Errorf("only %d reporting processes checked over 200 steps: the allocator feed did not reach the scrape", joined)
	}
}

// BenchmarkScrape is one full gather of the exporter on the simulated node
// with 16 processes per GPU, every slot started, allocator stats fed.
func BenchmarkScrape(b *testing.B) {
	p, _, store := simulatedNode(b, 16)
	for i := 0; i < 60; i++ {
		if err := p.Poll(); err != nil {
			b.Fatal(err)
		}
	}
	reg := newRegistry(b, sources(p, store, fakeResolver{}))
	var g prometheus.Gatherer = reg
	mfs, err := g.Gather()
	if err != nil {
		b.Fatal(err)
	}
	series := 0
	for _, mf := range mfs {
		series += len(mf.GetMetric())
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Gather(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(series), "series/op")
}
