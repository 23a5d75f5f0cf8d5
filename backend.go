package main

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/simulate"
	"github.com/gpumem/gpumem_exporter/workload"
)

// backend is what --nvml.backend chooses: the NVML library, what names
// processes and tells whether they run, and which pids the library can
// list.
type backend struct {
	lib       nvml.Interface
	processes workload.Tracker
	sees      func(pid uint32) bool // nil: every pid
}

// newBackend is the one place that chooses between a real GPU and the
// simulated node. The simulated node is an NVML library whose polls
// advance it; its processes report their allocator state to store as
// instrumented processes do, each through a session of its own that stays
// open while it runs, so that the TTL, the linger (once Prune, asking the
// node, finds a process gone) and the unlisted grace apply to them as to
// any client. Each reports under a uid of its own (the load scenario's,
// under its slot's), so that the per-uid process cap of the flags holds
// the node unchanged (128 processes at 16 per GPU, twice the per-uid
// default); the store's process cap is raised by the most processes the
// node runs at once, so that its live processes leave real clients and
// those that exited the room --allocstats.max-processes gives them. The
// node names and tracks its own processes before the resolver, and its
// NVML lists only them.
func newBackend(o *options, store *allocstats.Store, resolver *workload.ProcResolver, logger log.Logger) (backend, error) {
	if o.nvmlBackend != "simulated" {
		return backend{lib: &hintingNVML{Interface: nvml.New(), logger: log.With(logger, "component", "nvml")}, processes: resolver}, nil
	}
	sim, err := simulate.New(simulate.Config{Scenario: o.simScenario, ProcessesPerGPU: o.simProcesses, Seed: o.simSeed, Speed: o.simSpeed, Open: simulate.Sessions(store)})
	if err != nil {
		return backend{}, err
	}
	store.SetProcessLimits(o.maxProcesses+sim.MaxProcesses(), o.maxProcessesPerUID)
	level.Info(logger).Log("msg", "using the simulated NVML backend: 8 scripted H200 GPUs", "scenario", sim.Scenario(), "seed", o.simSeed, "speed", o.simSpeed)
	return backend{lib: sim.Advancing(), processes: workload.Trackers{sim, resolver}, sees: sim.Sees}, nil
}
