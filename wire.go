package main

// The wiring: sources (nvmlpoll, allocstats, workload, simulate) -> one
// join (attribution) -> its readers (collectors, OOM reports and their
// outputs, foresight, the landing page) -> HTTP. Each step is a function
// of its own; wire only calls them in order.

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/collector"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/oom"
	"github.com/gpumem/gpumem_exporter/oom/kubeevents"
)

// daemon is the wired exporter: its sources, the readers of the join, the
// HTTP handlers, and the goroutines that run them.
type daemon struct {
	mux, health    http.Handler
	healthListener net.Listener
	src            *sources
	events         *kubeevents.Recorder // nil: no Events
	running        sync.WaitGroup
}

// wait returns once the poller, the OOM reports and the socket server
// have stopped (after the context of wire ends).
func (d *daemon) wait() { d.running.Wait() }

// close releases what the daemon holds; after wait, the poller, the
// resolver's only caller, has stopped.
func (d *daemon) close() {
	if d.healthListener != nil {
		d.healthListener.Close()
	}
	if d.src != nil {
		d.src.resolver.Close()
	}
	d.events.Stop()
}

// wire builds the daemon of the flags, a step each: the health listener,
// the sources, the Events recorder, the join and its readers (newReaders
// says an OOM's route), the socket server, the collectors, the goroutines
// and the HTTP handlers. On an error it releases what it took.
func wire(ctx context.Context, o *options, logger, bare log.Logger) (_ *daemon, err error) {
	d := &daemon{}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.healthListener, err = listenHealth(o); err != nil {
		return nil, err
	}
	if d.src, err = startSources(ctx, o, logger, bare); err != nil {
		return nil, err
	}
	if d.events, err = kubeevents.Start(ctx, o.oomEvents && d.src.podWatch != nil, o.kubeconfig, o.nodeName, log.With(logger, "component", "kubernetes")); err != nil {
		return nil, err
	}
	r := newReaders(o, d.src, d.events, logger)
	srv, err := socketServer(o, d.src.store, d.src.poller.KnownDevice, log.With(logger, "component", "allocstats"))
	if err != nil {
		return nil, err
	}
	level.Info(logger).Log("msg", "allocator stats socket ready; point clients at it with GPUMEM_SOCKET", "socket", srv.SocketPath())
	exp, err := collector.New(collector.Sources{Join: r.join, NVMLHealth: d.src.poller, AllocstatsHealth: srv, KubernetesHealth: d.src.podHealth()}, logger)
	if err != nil {
		srv.Close()
		return nil, err
	}
	level.Info(logger).Log("msg", "enabled collectors", "collectors", strings.Join(collector.Enabled(), ","))
	d.run(ctx, d.src.poller, r.reports, srv, logger)
	d.health = healthHandler(d.src.poller, srv)
	d.mux = newMux(o, exp, ownRegistry(o, r), r, d, srv, logger)
	return d, nil
}

// run starts the poller, the OOM reports' builder and the socket server.
func (d *daemon) run(ctx context.Context, poller *nvmlpoll.Poller, reports *oom.Reports, srv *allocstats.Server, logger log.Logger) {
	d.running.Add(3)
	go func() { defer d.running.Done(); poller.Run(ctx) }()
	go func() { defer d.running.Done(); reports.Run(ctx) }()
	go func() {
		defer d.running.Done()
		if err := srv.Serve(ctx); err != nil {
			level.Error(logger).Log("msg", "allocator stats socket stopped", "err", err)
		}
	}()
}
