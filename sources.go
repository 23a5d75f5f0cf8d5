package main

import (
	"context"
	"sync"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/internal/logging"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/workload"
	"github.com/gpumem/gpumem_exporter/workload/pods"
)

// sources are the join's inputs: the allocator store (fed by the socket
// and the simulated node), the pod watch (nil outside Kubernetes), what
// names processes, and the NVML poller.
type sources struct {
	store    *allocstats.Store
	podWatch *pods.Informer
	resolver *workload.ProcResolver
	backend  backend
	poller   *nvmlpoll.Poller
}

// startSources starts the sources of the flags. After each poll the
// resolver labels the pids the join shows and the store forgets the
// processes that exited or that NVML no longer lists.
func startSources(ctx context.Context, o *options, logger, bare log.Logger) (*sources, error) {
	s := &sources{store: allocstats.NewStore(o.ttl)}
	s.store.SetProcessLimits(o.maxProcesses, o.maxProcessesPerUID)
	s.store.SetLinger(o.oomLinger)
	logging.RouteLibraryLogs(bare)
	var err error
	if s.podWatch, err = pods.Start(ctx, pods.Config{Kubeconfig: o.kubeconfig, NodeName: o.nodeName}, log.With(logger, "component", "kubernetes")); err != nil {
		return nil, err
	}
	var podLookup workload.PodLookup
	if s.podWatch != nil {
		podLookup = s.podWatch
	}
	s.resolver = workload.NewProcResolver(o.procPath, podLookup, log.With(logger, "component", "workload"))
	s.resolver.SetMaxPidfds(o.pidfds)
	if s.backend, err = newBackend(o, s.store, s.resolver, logger); err != nil {
		s.resolver.Close()
		return nil, err
	}
	running := workload.Running(o.procPath, s.backend.processes)
	s.poller = nvmlpoll.NewPoller(nvmlpoll.Config{Lib: s.backend.lib, Interval: o.pollInterval, ProcessRefresh: o.processRefresh, Logger: log.With(logger, "component", "nvml")})
	s.poller.OnPoll(func(snap *nvmlpoll.Snapshot) {
		s.resolver.Refresh(attribution.PIDsToLabel(snap, s.store.PIDs()))
		s.store.Prune(time.Now(), running)
		s.store.DropUnlisted(time.Now(), o.unlistedGrace, snap.ListedOn(s.backend.sees))
	})
	if o.releaseStartupPages {
		// Once: by the end of the first poll NVML is initialised and every
		// source has started; what start-up alone touched can go.
		var once sync.Once
		s.poller.OnPoll(func(*nvmlpoll.Snapshot) {
			once.Do(func() { go giveBackStartupMemory(logger) })
		})
	}
	return s, nil
}

// podHealth is the pod watch's health collector; nil outside Kubernetes.
func (s *sources) podHealth() prometheus.Collector {
	if s.podWatch == nil {
		return nil
	}
	return s.podWatch
}
