// Command gpumem_exporter tells where GPU memory went, process by process:
// NVML's per-GPU and per-process usage joined with the allocator statistics
// that instrumented processes push over a Unix socket, as Prometheus metrics.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/collector"
	"github.com/gpumem/gpumem_exporter/landing"
	"github.com/gpumem/gpumem_exporter/nvml"
	"github.com/gpumem/gpumem_exporter/workload"
)

const exporterName = "gpumem_exporter"

type options struct {
	metricsPath            string
	disableExporterMetrics bool
	logLevel, logFormat    string
	backend                string
	pollInterval           time.Duration
	simProcesses           int
	simSeed                int64
	procPath               string
	kubeconfig, nodeName   string
	socket                 string
	socketExplicit         bool
	socketMode             uint32
	maxMessageBytes        int
	maxConnections         int
	maxDevices             int
	idleTimeout, ttl       time.Duration
	oomReports             int
	webConfig              *web.FlagConfig
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	app := kingpin.CommandLine
	app.Name = exporterName
	app.Help = "Prometheus exporter of GPU memory per process: NVML joined with the framework allocators' own statistics."
	o.webConfig = kingpinflag.AddFlags(app, ":9481")
	app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&o.metricsPath)
	app.Flag("web.disable-exporter-metrics", "Exclude the exporter's own Go and process metrics (go_*, process_*).").BoolVar(&o.disableExporterMetrics)
	app.Flag("log.level", "Only log messages with the given severity or above: debug, info, warn, error.").Default("info").EnumVar(&o.logLevel, "debug", "info", "warn", "error")
	app.Flag("log.format", "Output format of log messages: logfmt, json.").Default("logfmt").EnumVar(&o.logFormat, "logfmt", "json")
	app.Flag("nvml.backend", "Where GPU data comes from: nvml (the real library) or simulated (a scripted 8-GPU H200 node).").Default("nvml").EnumVar(&o.backend, "nvml", "simulated")
	app.Flag("nvml.poll-interval", "How often NVML is polled; scrapes read the latest poll.").Default("1s").DurationVar(&o.pollInterval)
	app.Flag("nvml.simulated.processes-per-gpu", "Processes per GPU on the simulated node.").Default("3").IntVar(&o.simProcesses)
	app.Flag("nvml.simulated.seed", "Seed of the simulated node's script (the same seed gives the same run).").Default("1").Int64Var(&o.simSeed)
	app.Flag("path.procfs", "procfs mountpoint (the host's /proc, e.g. /host/proc in a container).").Default("/proc").StringVar(&o.procPath)
	app.Flag("kubernetes.kubeconfig", "Kubeconfig for pod attribution; empty: in-cluster config when running in a pod, none otherwise.").Default("").StringVar(&o.kubeconfig)
	app.Flag("kubernetes.node-name", "This node's name, to watch only its pods.").Envar("NODE_NAME").Default("").StringVar(&o.nodeName)
	app.Flag("allocstats.socket", "Unix socket where instrumented processes push allocator stats. When the default directory cannot be created, $XDG_RUNTIME_DIR/gpumem/ or a temporary directory is used.").
		Default(allocstats.DefaultSocketPath).IsSetByUser(&o.socketExplicit).StringVar(&o.socket)
	app.Flag("allocstats.socket-mode", "File mode of the socket (octal). World-writable by default: identity comes from the kernel.").Default("0666").Uint32Var(&o.socketMode)
	app.Flag("allocstats.max-message-bytes", "Longest accepted message line; a longer one closes the connection.").Default("65536").IntVar(&o.maxMessageBytes)
	app.Flag("allocstats.max-connections", "Most client connections at once.").Default("1024").IntVar(&o.maxConnections)
	app.Flag("allocstats.max-devices", "Most devices in one stats message.").Default("64").IntVar(&o.maxDevices)
	app.Flag("allocstats.idle-timeout", "Close a connection that sends nothing for this long.").Default("5m").DurationVar(&o.idleTimeout)
	app.Flag("allocstats.ttl", "Keep a process's allocator series this long after its connection closes (they go at once when it exits).").Default("2m").DurationVar(&o.ttl)
	app.Flag("allocstats.oom-reports", "How many out-of-memory reports /api/v1/oom-reports keeps.").Default("32").IntVar(&o.oomReports)
	app.Version(version.Print(exporterName))
	app.HelpFlag.Short('h')
	if _, err := app.Parse(args); err != nil {
		return nil, err
	}
	if o.pollInterval <= 0 {
		return nil, fmt.Errorf("--nvml.poll-interval must be positive, got %s", o.pollInterval)
	}
	if o.simProcesses < 1 || o.simProcesses > 99 {
		return nil, fmt.Errorf("--nvml.simulated.processes-per-gpu must be between 1 and 99, got %d", o.simProcesses)
	}
	return o, nil
}

func init() {
	if version.Version == "" {
		version.Version = "0.1.0-dev"
	}
}

// newLogger returns the project's logger, and the same without timestamp
// and caller for the slog bridge (slog records carry their own).
func newLogger(o *options) (log.Logger, log.Logger) {
	var logger log.Logger
	if o.logFormat == "json" {
		logger = log.NewJSONLogger(log.NewSyncWriter(os.Stderr))
	} else {
		logger = log.NewLogfmtLogger(log.NewSyncWriter(os.Stderr))
	}
	logger = level.NewFilter(logger, level.Allow(level.ParseDefault(o.logLevel, level.InfoValue())))
	return log.With(logger, "ts", log.DefaultTimestampUTC, "caller", log.DefaultCaller), logger
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", exporterName, err)
		os.Exit(2)
	}
	logger, bare := newLogger(o)
	if err := run(o, logger, bare); err != nil {
		level.Error(logger).Log("msg", "exiting", "err", err)
		os.Exit(1)
	}
}

func run(o *options, logger, bare log.Logger) error {
	level.Info(logger).Log("msg", "starting "+exporterName, "version", version.Info(), "build_context", version.BuildContext())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	d, err := wire(ctx, o, logger, bare)
	if err != nil {
		return err
	}

	server := &http.Server{Handler: d.mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() {
		errc <- web.ListenAndServe(server, o.webConfig, slogkitLogger(bare))
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving HTTP: %w", err)
		}
	case <-ctx.Done():
		level.Info(logger).Log("msg", "shutting down")
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdownCtx)
	}
	d.wait()
	return nil
}

// daemon is the wired exporter: poller, socket server, HTTP handlers.
type daemon struct {
	mux  *http.ServeMux
	wait func()
}

func wire(ctx context.Context, o *options, logger, bare log.Logger) (*daemon, error) {
	store := allocstats.NewStore(o.ttl)
	reg := prometheus.NewRegistry()
	pods, err := podLookup(ctx, o, logger, bare, reg)
	if err != nil {
		return nil, err
	}
	resolver := workload.NewProcResolver(o.procPath, pods, log.With(logger, "component", "workload"))

	cfg := nvml.Config{Interval: o.pollInterval, Logger: log.With(logger, "component", "nvml")}
	var oomSink func(allocstats.OOMEvent)
	switch o.backend {
	case "simulated":
		sim := nvml.NewSimulator(nvml.SimConfig{
			ProcessesPerGPU: o.simProcesses,
			Seed:            o.simSeed,
			OnStep:          func(s nvml.SimStep) { feedSimulated(store, s, oomSink) },
		})
		cfg.Lib = sim.Interface()
		cfg.BeforePoll = sim.Step
		level.Info(logger).Log("msg", "using the simulated NVML backend: 8 scripted H200 GPUs", "processes_per_gpu", o.simProcesses, "seed", o.simSeed)
	default:
		cfg.Lib = gonvml.New()
	}
	cfg.OnPoll = []func(*nvml.Snapshot){func(s *nvml.Snapshot) {
		resolver.Refresh(union(s.PIDs(), store.PIDs()))
		store.Prune(time.Now(), func(pid uint32, start uint64) bool {
			st, err := workload.StartTime(o.procPath, pid)
			if errors.Is(err, fs.ErrNotExist) {
				return false // exited
			}
			if err != nil {
				return true // cannot tell; the TTL still applies after a disconnect
			}
			return start == 0 || st == start
		})
	}}
	poller := nvml.NewPoller(cfg)

	describe := func(pid uint32) allocstats.ProcessLabels {
		in, _ := resolver.Lookup(pid)
		if in.Comm == "" {
			in.Comm = nvmlName(poller.Snapshot(), pid)
		}
		return allocstats.ProcessLabels{Comm: in.Comm, Namespace: in.Namespace, Pod: in.Pod, Container: in.Container}
	}
	reports := allocstats.NewOOMReports(o.oomReports, poller.Snapshot, store, describe, log.With(logger, "component", "oom"))
	oomSink = reports.Record

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
		KnownDevice:     knownDevice(poller),
		StartTime:       func(pid uint32) (uint64, error) { return workload.StartTime(o.procPath, pid) },
		OnOOM:           reports.Record,
	}, store, log.With(logger, "component", "allocstats"), reg)
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(); err != nil {
		return nil, err
	}
	level.Info(logger).Log("msg", "allocator stats socket ready; point clients at it with GPUMEM_SOCKET", "socket", srv.SocketPath())

	exp, err := collector.New(collector.Sources{
		NVML:       poller,
		NVMLHealth: poller,
		Allocator:  store,
		Workload:   resolver,
	}, logger)
	if err != nil {
		return nil, err
	}
	level.Info(logger).Log("msg", "enabled collectors", "collectors", strings.Join(collector.Enabled(), ","))
	reg.MustRegister(exp, versioncollector.NewCollector(exporterName))
	gatherers := prometheus.Gatherers{reg}
	if !o.disableExporterMetrics {
		own := prometheus.NewRegistry()
		own.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		gatherers = append(gatherers, own)
	}

	done := make(chan struct{}, 2)
	go func() { poller.Run(ctx); done <- struct{}{} }()
	go func() {
		if err := srv.Serve(ctx); err != nil {
			level.Error(logger).Log("msg", "allocator stats socket stopped", "err", err)
		}
		done <- struct{}{}
	}()

	mux := http.NewServeMux()
	mux.Handle(o.metricsPath, promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{
		ErrorLog:            promhttpLogger{logger},
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 10,
	}))
	mux.HandleFunc("/-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "Healthy.")
	})
	mux.HandleFunc("/-/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !poller.Ready() {
			http.Error(w, "Not ready: NVML has not been polled yet.", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "Ready.")
	})
	mux.Handle("/api/v1/oom-reports", reports)
	page := landing.New(landing.Config{
		Name:        exporterName,
		Version:     version.Info(),
		MetricsPath: o.metricsPath,
		Backend:     o.backend,
		Socket:      srv.SocketPath(),
		Snapshot:    poller.Snapshot,
		Allocator:   store,
		NVMLUp:      poller.Up,
		Reports:     reports,
		Workload:    resolver,
	})
	mux.Handle("/", page)
	return &daemon{mux: mux, wait: func() { <-done; <-done }}, nil
}

// nvmlName is NVML's name for pid, the fallback when /proc has none.
func nvmlName(snap *nvml.Snapshot, pid uint32) string {
	if snap == nil {
		return ""
	}
	for i := range snap.Devices {
		for _, p := range snap.Devices[i].Processes {
			if p.PID == pid {
				return p.Name
			}
		}
	}
	return ""
}

func union(a, b []uint32) []uint32 {
	seen := make(map[uint32]struct{}, len(a)+len(b))
	out := make([]uint32, 0, len(a)+len(b))
	for _, s := range [][]uint32{a, b} {
		for _, p := range s {
			if _, ok := seen[p]; !ok {
				seen[p] = struct{}{}
				out = append(out, p)
			}
		}
	}
	return out
}

// knownDevice matches a normalised UUID against the devices NVML lists.
func knownDevice(p *nvml.Poller) func(string) (string, bool) {
	return func(uuid string) (string, bool) {
		d, ok := p.Snapshot().Device(uuid)
		if !ok {
			return "", false
		}
		return d.UUID, true
	}
}

// feedSimulated hands the simulated node's allocator state to the store,
// as real clients would over the socket.
func feedSimulated(store *allocstats.Store, s nvml.SimStep, oom func(allocstats.OOMEvent)) {
	now := time.Now()
	for _, pid := range s.Exited {
		store.Remove(pid)
	}
	opt := func(v uint64) allocstats.Optional { return allocstats.Optional{V: v, OK: true} }
	for _, a := range s.Allocators {
		r := allocstats.DeviceReport{
			UUID: a.UUID, Reserved: a.Reserved,
			Active: opt(a.Active), Allocated: opt(a.Allocated), InactiveSplit: opt(a.InactiveSplit),
			PeakReserved: opt(a.PeakReserved), PeakActive: opt(a.PeakActive),
			AllocRetries: opt(a.AllocRetries), OOMs: opt(a.OOMs),
		}
		if a.Limit > 0 {
			r.Limit = opt(a.Limit)
		}
		store.ApplySynthetic(a.PID, "pytorch", []allocstats.DeviceReport{r}, now)
	}
	for _, o := range s.OOMs {
		ev, ok := store.RecordOOMSynthetic(o.PID, o.UUID, o.Requested, now)
		if ok && oom != nil {
			ev.Limit, ev.Free = opt(o.Limit), opt(o.Free)
			oom(ev)
		}
	}
}

type promhttpLogger struct{ logger log.Logger }

func (l promhttpLogger) Println(v ...interface{}) {
	level.Error(l.logger).Log("msg", fmt.Sprint(v...))
}
