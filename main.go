// Command gpumem_exporter tells where GPU memory went, process by process:
// NVML's per-GPU and per-process usage joined with the allocator statistics
// that instrumented processes push over a Unix socket, as Prometheus metrics.
//
// This file holds the wiring only: sources (nvmlpoll, allocstats,
// workload, simulate) -> one join (attribution) -> collectors, OOM reports
// (oom) and the landing page -> HTTP.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/collector"
	"github.com/gpumem/gpumem_exporter/exposition"
	"github.com/gpumem/gpumem_exporter/foresight"
	"github.com/gpumem/gpumem_exporter/internal/authguard"
	"github.com/gpumem/gpumem_exporter/internal/connshed"
	"github.com/gpumem/gpumem_exporter/internal/fdbudget"
	"github.com/gpumem/gpumem_exporter/internal/logging"
	"github.com/gpumem/gpumem_exporter/internal/memtrim"
	"github.com/gpumem/gpumem_exporter/internal/ratelog"
	"github.com/gpumem/gpumem_exporter/landing"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/oom"
	"github.com/gpumem/gpumem_exporter/simulate"
	"github.com/gpumem/gpumem_exporter/workload"
	"github.com/gpumem/gpumem_exporter/workload/podevents"
	"github.com/gpumem/gpumem_exporter/workload/pods"
)

func init() {
	if version.Version == "" {
		version.Version = "0.1.0-dev"
	}
}

func main() {
	o, err := parseFlags(kingpin.CommandLine, os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", exporterName, err)
		os.Exit(2)
	}
	logger, bare := logging.New(o.logLevel, o.logFormat)
	if err := runExporter(o, logger, bare); err != nil {
		level.Error(logger).Log("msg", "exiting", "err", err)
		os.Exit(1)
	}
}

// runExporter serves until SIGINT or SIGTERM, or until serving fails.
func runExporter(o *options, logger, bare log.Logger) error {
	level.Info(logger).Log("msg", "starting "+exporterName, "version", version.Version, "revision", version.Revision, "build_context", version.BuildContext())
	if o.gomaxprocs > 0 {
		runtime.GOMAXPROCS(o.gomaxprocs)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The listen addresses first: a port in use must fail before the
	// socket or NVML is touched.
	listeners, err := listenWeb(o)
	if err != nil {
		return err
	}
	defer closeAll(listeners)
	if err := fitFileLimit(o, logger); err != nil {
		return err
	}

	d, err := wire(ctx, o, logger, bare)
	if err != nil {
		return err
	}
	defer d.close()

	server := &http.Server{
		Handler:           d.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		// Idle keep-alive connections are closed, so that a flood of them
		// cannot hold file descriptors the socket and scrapes need.
		IdleTimeout: time.Minute,
	}
	// The listeners' caps close the connections the server waits on,
	// never one it serves (internal/connshed says why that and not
	// shorter deadlines or per-source limits).
	connshed.Configure(server)
	if *o.webConfig.WebConfigFile != "" {
		// Basic auth's bcrypt checks: bounded, never queued (internal/authguard).
		authguard.New(authguard.Options{}).Protect(server)
	}
	errc := make(chan error, 2)
	go func() {
		if listeners == nil { // systemd socket activation
			errc <- web.ListenAndServe(server, o.webConfig, logging.Slog(bare, "web"))
			return
		}
		errc <- web.ServeMultiple(listeners, server, o.webConfig, logging.Slog(bare, "web"))
	}()
	var health *http.Server
	if d.healthListener != nil {
		// Probes are a header and a line: every step has a short deadline,
		// and the listener's cap of fdbudget.HealthMaxConnections sheds as the
		// metrics listeners do.
		health = &http.Server{Handler: d.health, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second}
		connshed.Configure(health)
		go func() { errc <- health.Serve(d.healthListener) }()
	}
	var runErr error
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("serving HTTP: %w", err)
		}
		stop()
	case <-ctx.Done():
		level.Info(logger).Log("msg", "shutting down")
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = server.Shutdown(shutdownCtx)
	if health != nil {
		_ = health.Shutdown(shutdownCtx)
	}
	d.wait()
	return runErr
}

// giveBackStartupMemory gives back the memory only start-up used
// (--runtime.release-startup-pages; internal/memtrim says how).
func giveBackStartupMemory(logger log.Logger) {
	res, err := memtrim.Release()
	if err != nil {
		level.Warn(logger).Log("msg", "could not give back all the memory start-up used", "err", err, "rss_before_mib", mib(res.Before), "rss_after_mib", mib(res.After))
		return
	}
	msg := "gave back the memory start-up used"
	if res.NoPageout {
		msg += "; the kernel cannot reclaim pages on request (MADV_PAGEOUT, Linux 5.4), so only the binary's pages left the page cache"
	}
	level.Info(logger).Log("msg", msg, "rss_before_mib", mib(res.Before), "rss_after_mib", mib(res.After), "mappings", res.Regions, "binary_uncached", res.BinaryUncached)
}

func mib(b uint64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }

// listenWeb opens every --web.listen-address (capped at --web.max-connections
// each, see internal/connshed), or returns nil listeners under systemd
// socket activation.
func listenWeb(o *options) ([]net.Listener, error) {
	if o.webConfig.WebSystemdSocket != nil && *o.webConfig.WebSystemdSocket {
		return nil, nil
	}
	var ls []net.Listener
	for _, addr := range *o.webConfig.WebListenAddresses {
		if strings.HasPrefix(addr, "vsock://") {
			closeAll(ls)
			return nil, fmt.Errorf("--web.listen-address=%s: vsock addresses need --web.systemd-socket off and are not supported by this exporter", addr)
		}
		l, err := connshed.Listen(addr, o.webMaxConnections)
		if err != nil {
			closeAll(ls)
			return nil, fmt.Errorf("--web.listen-address=%s: %w", addr, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		l.Close()
	}
}

// daemon is the wired exporter: poller, socket server, HTTP handlers.
type daemon struct {
	mux, health    http.Handler
	healthListener net.Listener
	wait           func()
	close          func()
}

func wire(ctx context.Context, o *options, logger, bare log.Logger) (*daemon, error) {
	var healthListener net.Listener
	if o.healthAddress != "" {
		l, err := connshed.Listen(o.healthAddress, fdbudget.HealthMaxConnections)
		if err != nil {
			return nil, fmt.Errorf("--web.health-address=%s: %w", o.healthAddress, err)
		}
		healthListener = l
	}
	closeHealth := func() {
		if healthListener != nil {
			healthListener.Close()
		}
	}

	// Sources.
	store := allocstats.NewStore(o.ttl)
	store.SetProcessLimits(o.maxProcesses, o.maxProcessesPerUID)
	store.SetLinger(o.oomLinger)
	logging.RouteLibraryLogs(bare)
	podWatch, err := pods.Start(ctx, pods.Config{Kubeconfig: o.kubeconfig, NodeName: o.nodeName}, log.With(logger, "component", "kubernetes"))
	if err != nil {
		closeHealth()
		return nil, err
	}
	oomEvents, err := startOOMEvents(ctx, o.oomEvents && podWatch != nil, o.kubeconfig, o.nodeName, log.With(logger, "component", "kubernetes"))
	if err != nil {
		closeHealth()
		return nil, err
	}
	var podLookup workload.PodLookup
	var podHealth prometheus.Collector
	if podWatch != nil {
		podLookup, podHealth = podWatch, podWatch
	}
	resolver := workload.NewProcResolver(o.procPath, podLookup, log.With(logger, "component", "workload"))
	resolver.SetMaxPidfds(o.pidfds)

	b, err := newBackend(o, store, resolver, logger)
	if err != nil {
		closeHealth()
		return nil, err
	}
	running := workload.Running(o.procPath, b.processes)
	poller := nvmlpoll.NewPoller(nvmlpoll.Config{Lib: b.lib, Interval: o.pollInterval, ProcessRefresh: o.processRefresh, Logger: log.With(logger, "component", "nvml")})
	poller.OnPoll(func(s *nvmlpoll.Snapshot) {
		resolver.Refresh(attribution.PIDsToLabel(s, store.PIDs()))
		store.Prune(time.Now(), running)
		store.DropUnlisted(time.Now(), o.unlistedGrace, s.ListedOn(b.sees))
	})
	if o.releaseStartupPages {
		// Once: by the end of the first poll NVML is initialised and every
		// source has started; what start-up alone touched can go.
		var once sync.Once
		poller.OnPoll(func(*nvmlpoll.Snapshot) {
			once.Do(func() { go giveBackStartupMemory(logger) })
		})
	}

	// The one join, and what reads it.
	// Memory labels the processes that exited, which the store keeps for
	// --allocstats.oom-linger, as they were labelled while they ran.
	warnBefore := o.warnBefore
	if warnBefore == 0 {
		warnBefore = -1 // the flag's 0: no warnings
	}
	forecaster := foresight.New(foresight.Config{WarnBefore: warnBefore, Clients: store, Logger: log.With(logger, "component", "foresight")})
	join := attribution.Sources{NVML: poller, Allocator: store, Workload: b.processes, SettleLabels: true, Memory: attribution.NewMemory(),
		Node: workload.NodeName(o.nodeName), Forecasts: forecaster}
	reports := oom.New(oom.Config{Capacity: o.oomReports, Sources: join, Fresh: poller.Fresh, Trends: forecaster, Logger: log.With(logger, "component", "oom"),
		OnReport: func(rep oom.Report) {
			oomEvents.OOM(podevents.PodRef{Namespace: rep.Namespace, Name: rep.Pod, UID: rep.PodUID}, rep.Sentence())
		}})
	store.OnOOM(reports.Record)
	store.OnSample(forecaster)
	poller.OnPoll(attribution.NewFollower(join, forecaster, reports).Observe)

	srv, err := socketServer(o, store, poller.KnownDevice, max(o.warnBefore, 0), log.With(logger, "component", "allocstats"))
	if err != nil {
		closeHealth()
		return nil, err
	}
	level.Info(logger).Log("msg", "allocator stats socket ready; point clients at it with GPUMEM_SOCKET", "socket", srv.SocketPath())

	exp, err := collector.New(collector.Sources{
		Join:             join,
		NVMLHealth:       poller,
		AllocstatsHealth: srv,
		KubernetesHealth: podHealth,
	}, logger)
	if err != nil {
		srv.Close()
		closeHealth()
		return nil, err
	}
	level.Info(logger).Log("msg", "enabled collectors", "collectors", strings.Join(collector.Enabled(), ","))
	// One registry for what client_golang collects (build info, the
	// exporter's own Go and process metrics, ...). The collectors' series
	// are written straight to the text format (exposition); only a
	// protobuf scrape gathers them through client_golang.
	reg := prometheus.NewRegistry()
	reg.MustRegister(versioncollector.NewCollector(exporterName), ratelog.Default, reports, forecaster)
	if !o.disableExporterMetrics {
		reg.MustRegister(collectors.NewGoCollector(), exposition.NewProcessCollector())
	}

	done := make(chan struct{}, 3)
	go func() { poller.Run(ctx); done <- struct{}{} }()
	go func() { reports.Run(ctx); done <- struct{}{} }()
	go func() {
		if err := srv.Serve(ctx); err != nil {
			level.Error(logger).Log("msg", "allocator stats socket stopped", "err", err)
		}
		done <- struct{}{}
	}()

	healthMux := healthHandler(poller, srv)
	mux := http.NewServeMux()
	mux.Handle(o.metricsPath, exposition.NewHandler(exp, reg, exposition.Options{
		ErrorLog:            logging.PromHTTP{Logger: logger},
		MaxRequestsInFlight: 10,
		Fallback:            prometheus.Gatherers{reg, exp.Gatherer()},
	}))
	mux.Handle("/-/", healthMux)
	if debugHandlers != nil {
		debugHandlers(mux)
	}
	mux.Handle("/api/v1/oom-reports", reports)
	mux.Handle("/", landing.New(landing.Config{
		Name:        exporterName,
		Version:     version.Version,
		Revision:    version.Revision,
		MetricsPath: o.metricsPath,
		Backend:     o.nvmlBackend,
		Socket:      srv.SocketPath(),
		Sources:     join,
		NVMLUp:      poller.Up,
		Reports:     reports,
	}))
	return &daemon{
		mux:            mux,
		health:         healthMux,
		healthListener: healthListener,
		wait:           func() { <-done; <-done; <-done },
		// After wait: the poller, the resolver's only caller, has stopped.
		close: func() { closeHealth(); resolver.Close(); oomEvents.Stop() },
	}, nil
}

// debugHandlers adds handlers for profiling; set only in a build with
// -tags pprof (pprof_build.go).
var debugHandlers func(*http.ServeMux)

// socketServer is the allocator stats server of the flags, reporting to
// store and checking reported devices with knownDevice, listening.
func socketServer(o *options, store *allocstats.Store, knownDevice func(string) (string, uint64, bool), warnBefore time.Duration, logger log.Logger) (*allocstats.Server, error) {
	srv, err := allocstats.NewServer(allocstats.Config{
		SocketPath:      o.socket,
		SocketExplicit:  o.socketExplicit,
		SocketMode:      os.FileMode(o.socketMode),
		MaxMessageBytes: o.maxMessageBytes,
		MaxConnections:  o.maxConnections,
		MaxDevices:      o.maxDevices,
		IdleTimeout:     o.idleTimeout,
		Interval:        o.pollInterval,
		ServerVersion:   version.Version,
		OOMVerdict:      true, // the OOM reports answer through OOMEvent.Reply
		WarnBefore:      warnBefore,
		KnownDevice:     knownDevice,
		ProcPath:        o.procPath,

		MaxConnectionsPerUID: o.maxConnectionsPerUID,
		MaxBufferedBytes:     o.maxBufferedBytes,
	}, store, logger)
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(); err != nil {
		if o.socketExplicit {
			return nil, fmt.Errorf("--allocstats.socket=%s: %w; make that directory (writable by this user), or leave the flag out for the default", o.socket, err)
		}
		return nil, fmt.Errorf("%w; give --allocstats.socket a path in a directory this user can write", err)
	}
	return srv, nil
}

// healthHandler serves /-/healthy and /-/ready.
func healthHandler(p *nvmlpoll.Poller, srv *allocstats.Server) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "Healthy.")
	})
	mux.HandleFunc("/-/ready", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := readiness(p, srv); !ok {
			http.Error(w, "Not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "Ready.")
	})
	return mux
}

// readiness says whether /-/ready is green: the socket is in place and NVML
// has been polled successfully.
func readiness(p *nvmlpoll.Poller, srv *allocstats.Server) (bool, string) {
	if !srv.SocketReady() {
		return false, "The allocator stats socket file vanished and cannot be recreated (see the log)."
	}
	if p.Ready() {
		return true, ""
	}
	if p.Polled() {
		return false, "NVML was polled but the poll failed (is the NVIDIA driver loaded? see gpumem_nvml_errors_total)."
	}
	return false, "NVML has not been polled yet."
}

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

// fitFileLimit fits the connection caps under the open file limit
// (internal/fdbudget) and gives the resolver what they leave.
func fitFileLimit(o *options, logger log.Logger) error {
	listeners := 1
	if o.webConfig != nil && o.webConfig.WebListenAddresses != nil {
		listeners = max(1, len(*o.webConfig.WebListenAddresses))
	}
	c := fdbudget.Caps{
		SocketConnections: o.maxConnections, SocketConnectionsPerUID: o.maxConnectionsPerUID,
		WebConnections: o.webMaxConnections, WebListeners: listeners, MaxPidfds: workload.MaxPidfds,
	}
	if o.healthAddress != "" {
		c.HealthConnections = fdbudget.HealthMaxConnections
	}
	c, err := fdbudget.Fit(c, logger)
	if err != nil {
		return err
	}
	o.maxConnections, o.maxConnectionsPerUID, o.pidfds = c.SocketConnections, c.SocketConnectionsPerUID, c.Pidfds
	return nil
}
