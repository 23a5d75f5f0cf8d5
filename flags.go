package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/foresight"
	"github.com/gpumem/gpumem_exporter/internal/defaults"
	"github.com/gpumem/gpumem_exporter/oom"
	"github.com/gpumem/gpumem_exporter/simulate"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// exporterName names the program in its help, version and build info.
const exporterName = "gpumem_exporter"

// options are the parsed command line. Defaults live in the flag
// definitions only (from the packages' Default… constants and from
// internal/defaults).
type options struct {
	metricsPath            string
	disableExporterMetrics bool
	healthAddress          string
	webMaxConnections      int
	gomaxprocs             int
	releaseStartupPages    bool
	logLevel, logFormat    string
	nvmlBackend            string
	pollInterval           time.Duration
	processRefresh         time.Duration
	simScenario            string
	simSpeed               float64
	simProcesses           int
	simSeed                int64
	procPath               string
	kubeconfig, nodeName   string
	oomEvents              bool
	socket                 string
	socketExplicit         bool
	socketMode             octalMode
	maxMessageBytes        int
	maxConnections         int
	maxDevices             int
	idleTimeout, ttl       time.Duration
	maxConnectionsPerUID   int
	pidfds                 int // the resolver's pidfds: what the file limit leaves, up to workload.MaxPidfds (set by fitFileLimit)
	maxProcesses           int
	maxProcessesPerUID     int
	maxBufferedBytes       int
	unlistedGrace          time.Duration
	oomLinger              time.Duration
	oomReports             int
	warnBefore             time.Duration
	webConfig              *web.FlagConfig
}

// reservedPaths are served by the daemon itself; the metrics cannot move
// there.
var reservedPaths = []string{"/", "/-/healthy", "/-/ready", "/api/v1/oom-reports"}

// parseFlags parses args on app (kingpin.CommandLine in main; the
// collectors' --collector.* flags are registered there). Every error names
// its flag.
func parseFlags(app *kingpin.Application, args []string) (*options, error) {
	o := &options{socketMode: allocstats.DefaultSocketMode}
	app.Name = exporterName
	app.Help = "Prometheus exporter of GPU memory per process: NVML joined with the framework allocators' own statistics."
	o.webConfig = kingpinflag.AddFlags(app, ":"+strconv.Itoa(defaults.MetricsPort))
	app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default(defaults.TelemetryPath).StringVar(&o.metricsPath)
	app.Flag("web.disable-exporter-metrics", "Exclude the exporter's own Go and process metrics (go_*, process_*).").BoolVar(&o.disableExporterMetrics)
	app.Flag("web.health-address", "Also serve /-/healthy and /-/ready, without TLS or authentication, on this address (for probes when --web.config.file turns on basic auth). Empty: off.").Default("").StringVar(&o.healthAddress)
	app.Flag("web.max-connections", "Most HTTP connections open at once per listen address; at the cap a new connection closes one the server is waiting on (no request served yet, then idle between requests), never one whose request is being served.").Default("64").SetValue(&intFlag{"web.max-connections", &o.webMaxConnections})
	app.Flag("runtime.gomaxprocs", "The most OS threads running Go code at once (GOMAXPROCS), as in node_exporter: 1 keeps a scrape's and a poll's CPU lowest; raise it where hundreds of clients push at once. 0: one per CPU.").Envar("GOMAXPROCS").Default("1").SetValue(&intFlag{"runtime.gomaxprocs", &o.gomaxprocs})
	app.Flag("runtime.release-startup-pages", "After the first poll, give back the memory only start-up used: the pages of the binary and of NVML's libraries that no longer run (read back from disk one page at a time if ever needed) and the free heap (docs/benchmarks.md says how much). --no-runtime.release-startup-pages keeps them.").Default("true").BoolVar(&o.releaseStartupPages)
	app.Flag("log.level", "Only log messages with the given severity or above: debug, info, warn, error.").Default("info").SetValue(newEnumFlag("log.level", &o.logLevel, "debug", "info", "warn", "error"))
	app.Flag("log.format", "Output format of log messages: logfmt, json.").Default("logfmt").SetValue(newEnumFlag("log.format", &o.logFormat, "logfmt", "json"))
	app.Flag("nvml.backend", "Where GPU data comes from: nvml (the real library) or simulated (a scripted 8-GPU H200 node).").Default("nvml").SetValue(newEnumFlag("nvml.backend", &o.nvmlBackend, "nvml", "simulated"))
	app.Flag("nvml.poll-interval", "How often NVML is polled, at whole multiples of this interval (clock time); scrapes read the latest poll.").Default("1s").SetValue(&durationFlag{"nvml.poll-interval", &o.pollInterval})
	app.Flag("nvml.process-refresh", "Longest a GPU's process lists are reused: a poll reads a GPU's memory figures and reads its process lists only when those changed since the lists were read (a process started, exited, allocated or freed), or when the lists are this old. 0: read them at every poll.").Default("60s").SetValue(&durationFlag{"nvml.process-refresh", &o.processRefresh})
	app.Flag("nvml.simulated.scenario", "What the simulated node runs: "+strings.Join(simulate.Scenarios(), ", ")+". mix runs one of each workload; load runs --nvml.simulated.processes-per-gpu simple processes per GPU.").Default(scenario.Mix).SetValue(newEnumFlag("nvml.simulated.scenario", &o.simScenario, simulate.Scenarios()...))
	app.Flag("nvml.simulated.speed", "Simulated seconds per real second (60 runs an hour of the scenario in a minute).").Default("1").SetValue(&floatFlag{"nvml.simulated.speed", &o.simSpeed})
	app.Flag("nvml.simulated.processes-per-gpu", "Processes per GPU of the load scenario (1 to 99).").Default("3").SetValue(&intFlag{"nvml.simulated.processes-per-gpu", &o.simProcesses})
	app.Flag("nvml.simulated.seed", "Seed of the simulated node's script (the same seed gives the same run).").Default("1").SetValue(&int64Flag{"nvml.simulated.seed", &o.simSeed})
	app.Flag("path.procfs", "procfs mountpoint (the host's /proc; run in the host PID namespace).").Default(defaults.ProcPath).StringVar(&o.procPath)
	app.Flag("kubernetes.kubeconfig", "Kubeconfig for pod attribution; empty: in-cluster config when running in a pod, none otherwise.").Default("").StringVar(&o.kubeconfig)
	app.Flag("kubernetes.node-name", "This node's name, to watch only its pods.").Envar("NODE_NAME").Default("").StringVar(&o.nodeName)
	app.Flag("kubernetes.oom-events", "Record a Kubernetes Event (type Warning, reason GPUOutOfMemory) with the verdict on the pod of each out-of-memory report, aggregated and rate-limited as the kubelet's; needs create and patch on events. Only where pod attribution runs (in a pod, or with --kubernetes.kubeconfig). --no-kubernetes.oom-events turns it off.").Default("true").BoolVar(&o.oomEvents)
	app.Flag("allocstats.socket", "Unix socket where instrumented processes push allocator stats. When the default directory cannot be created, $XDG_RUNTIME_DIR/gpumem/ or a temporary directory is used; a path given here must be usable.").
		Default(allocstats.DefaultSocketPath).IsSetByUser(&o.socketExplicit).StringVar(&o.socket)
	app.Flag("allocstats.socket-mode", "File mode of the socket, in octal. World-writable by default: identity comes from the kernel.").Default(fmt.Sprintf("%#o", allocstats.DefaultSocketMode)).SetValue(&octalFlag{"allocstats.socket-mode", &o.socketMode})
	app.Flag("allocstats.max-message-bytes", "Longest accepted message line; a longer one closes the connection (at least 64).").Default(strconv.Itoa(allocstats.DefaultMaxMessageBytes)).SetValue(&intFlag{"allocstats.max-message-bytes", &o.maxMessageBytes})
	app.Flag("allocstats.max-connections", "Most client connections at once.").Default(strconv.Itoa(allocstats.DefaultMaxConnections)).SetValue(&intFlag{"allocstats.max-connections", &o.maxConnections})
	app.Flag("allocstats.max-devices", "Most devices in one stats message, and per process.").Default(strconv.Itoa(allocstats.DefaultMaxDevices)).SetValue(&intFlag{"allocstats.max-devices", &o.maxDevices})
	app.Flag("allocstats.idle-timeout", "Close a connection that sends nothing for this long.").Default(allocstats.DefaultIdleTimeout.String()).SetValue(&durationFlag{"allocstats.idle-timeout", &o.idleTimeout})
	app.Flag("allocstats.ttl", "Keep a process's allocator series this long after its connection closes (when it exits, see --allocstats.oom-linger).").Default(allocstats.DefaultTTL.String()).SetValue(&durationFlag{"allocstats.ttl", &o.ttl})
	app.Flag("allocstats.oom-linger", "Keep exporting the allocator counters (OOMs, retries, the last OOM) and gpumem_process_info of a process that exited this long, so that Prometheus scrapes an OOM raised right before the exit; 0 drops them at once.").Default(allocstats.DefaultOOMLinger.String()).SetValue(&durationFlag{"allocstats.oom-linger", &o.oomLinger})
	app.Flag("allocstats.max-connections-per-uid", "Most client connections of one uid at once.").Default(strconv.Itoa(allocstats.DefaultMaxConnectionsPerUID)).SetValue(&intFlag{"allocstats.max-connections-per-uid", &o.maxConnectionsPerUID})
	app.Flag("allocstats.max-processes", "Most processes whose allocator state is kept at once; a new one beyond has its messages rejected.").Default(strconv.Itoa(allocstats.DefaultMaxProcesses)).SetValue(&intFlag{"allocstats.max-processes", &o.maxProcesses})
	app.Flag("allocstats.max-processes-per-uid", "Most processes of one uid whose allocator state is kept at once.").Default(strconv.Itoa(allocstats.DefaultMaxProcessesPerUID)).SetValue(&intFlag{"allocstats.max-processes-per-uid", &o.maxProcessesPerUID})
	app.Flag("allocstats.max-buffered-bytes", "Most memory all connections together hold in unfinished lines; beyond it the connection holding the most is closed (at least --allocstats.max-message-bytes).").Default(strconv.Itoa(allocstats.DefaultMaxBufferedBytes)).SetValue(&intFlag{"allocstats.max-buffered-bytes", &o.maxBufferedBytes})
	app.Flag("allocstats.unlisted-grace", "Keep a process's allocator state on a GPU where NVML does not list the process this long, then drop it.").Default(allocstats.DefaultUnlistedGrace.String()).SetValue(&durationFlag{"allocstats.unlisted-grace", &o.unlistedGrace})
	app.Flag("allocstats.warn-before", "Send a process a warning over its socket connection when the daemon foresees it running out of GPU memory within this long at its current climb (a client may ask for another threshold in its hello); 0 sends none. The estimate is exported as gpumem_allocator_time_to_oom_seconds either way.").Default(foresight.DefaultWarnBefore.String()).SetValue(&durationFlag{"allocstats.warn-before", &o.warnBefore})
	app.Flag("allocstats.oom-reports", "How many out-of-memory reports /api/v1/oom-reports keeps.").Default(strconv.Itoa(oom.DefaultCapacity)).SetValue(&intFlag{"allocstats.oom-reports", &o.oomReports})
	app.Version(version.Print(exporterName))
	app.HelpFlag.Short('h')
	if _, err := app.Parse(args); err != nil {
		return nil, err
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *options) validate() error {
	positive := func(flag string, d time.Duration) error {
		if d <= 0 {
			return fmt.Errorf("--%s must be a positive duration such as 1s or 5m, got %s", flag, d)
		}
		return nil
	}
	notNegative := func(flag string, d time.Duration) error {
		if d < 0 {
			return fmt.Errorf("--%s must be 0 or a positive duration such as 1m, got %s", flag, d)
		}
		return nil
	}
	atLeast := func(flag string, v, lowest int) error {
		if v < lowest {
			return fmt.Errorf("--%s must be at least %d, got %d", flag, lowest, v)
		}
		return nil
	}
	for _, err := range []error{
		o.checkMetricsPath(),
		positive("nvml.poll-interval", o.pollInterval),
		notNegative("nvml.process-refresh", o.processRefresh),
		positive("allocstats.idle-timeout", o.idleTimeout),
		positive("allocstats.ttl", o.ttl),
		positive("allocstats.unlisted-grace", o.unlistedGrace),
		notNegative("allocstats.oom-linger", o.oomLinger),
		notNegative("allocstats.warn-before", o.warnBefore),
		atLeast("nvml.simulated.processes-per-gpu", o.simProcesses, 1),
		atLeast("allocstats.max-message-bytes", o.maxMessageBytes, 64),
		atLeast("allocstats.max-connections", o.maxConnections, 1),
		atLeast("allocstats.max-devices", o.maxDevices, 1),
		atLeast("allocstats.max-connections-per-uid", o.maxConnectionsPerUID, 1),
		atLeast("allocstats.max-processes", o.maxProcesses, 1),
		atLeast("allocstats.max-processes-per-uid", o.maxProcessesPerUID, 1),
		atLeast("allocstats.max-buffered-bytes", o.maxBufferedBytes, o.maxMessageBytes),
		atLeast("allocstats.oom-reports", o.oomReports, 1),
		atLeast("web.max-connections", o.webMaxConnections, 1),
		atLeast("runtime.gomaxprocs", o.gomaxprocs, 0),
	} {
		if err != nil {
			return err
		}
	}
	if o.simSpeed <= 0 || o.simSpeed > 3600 {
		return fmt.Errorf("--nvml.simulated.speed must be above 0 and at most 3600, got %g", o.simSpeed)
	}
	if o.simProcesses > 99 {
		return fmt.Errorf("--nvml.simulated.processes-per-gpu must be at most 99, got %d", o.simProcesses)
	}
	if o.socket == "" {
		return fmt.Errorf("--allocstats.socket must not be empty")
	}
	return o.checkWebConfig()
}

// checkWebConfig reads --web.config.file with exporter-toolkit's own
// loader, so that a file it would refuse fails at start-up, naming the file
// and the flag, before anything listens.
func (o *options) checkWebConfig() error {
	if o.webConfig == nil || o.webConfig.WebConfigFile == nil || *o.webConfig.WebConfigFile == "" {
		return nil
	}
	path := *o.webConfig.WebConfigFile
	if err := web.Validate(path); err != nil {
		return fmt.Errorf("--web.config.file=%s: %w; fix the file (the format, with passwords as bcrypt hashes: https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md) or leave the flag out", path, err)
	}
	return nil
}

func (o *options) checkMetricsPath() error {
	p := o.metricsPath
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("--web.telemetry-path must start with /, got %q", p)
	}
	for _, r := range reservedPaths {
		if p == r {
			return fmt.Errorf("--web.telemetry-path cannot be %s: the exporter serves %s there", p, strings.Join(reservedPaths, ", "))
		}
	}
	return nil
}

// Flag values whose parse errors name their flag (kingpin's do not).

// octalMode is a file mode written in octal, as chmod takes it.
type octalMode os.FileMode

type octalFlag struct {
	name string
	m    *octalMode
}

func (f *octalFlag) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v&^uint64(os.ModePerm) != 0 {
		return fmt.Errorf("--%s: want permission bits in octal, such as 0666 or 0660; got %q", f.name, s)
	}
	*f.m = octalMode(v)
	return nil
}

func (f *octalFlag) String() string { return fmt.Sprintf("%#o", uint32(*f.m)) }

type durationFlag struct {
	name string
	d    *time.Duration
}

func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("--%s: want a duration such as 1s or 5m, got %q", f.name, s)
	}
	*f.d = d
	return nil
}

func (f *durationFlag) String() string { return f.d.String() }

type intFlag struct {
	name string
	v    *int
}

func (f *intFlag) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("--%s: want a whole number, got %q", f.name, s)
	}
	*f.v = v
	return nil
}

func (f *intFlag) String() string { return strconv.Itoa(*f.v) }

type int64Flag struct {
	name string
	v    *int64
}

func (f *int64Flag) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("--%s: want a whole number, got %q", f.name, s)
	}
	*f.v = v
	return nil
}

func (f *int64Flag) String() string { return strconv.FormatInt(*f.v, 10) }

type floatFlag struct {
	name string
	v    *float64
}

func (f *floatFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("--%s: want a number such as 1 or 60, got %q", f.name, s)
	}
	*f.v = v
	return nil
}

func (f *floatFlag) String() string { return strconv.FormatFloat(*f.v, 'g', -1, 64) }

// enumFlag is one of a fixed set of words (kingpin's own enum does not
// name its flag when the value is none of them).
type enumFlag struct {
	name    string
	v       *string
	options []string
}

func newEnumFlag(name string, v *string, options ...string) *enumFlag {
	return &enumFlag{name: name, v: v, options: options}
}

func (f *enumFlag) Set(s string) error {
	for _, o := range f.options {
		if s == o {
			*f.v = s
			return nil
		}
	}
	return fmt.Errorf("--%s: want one of %s, got %q", f.name, strings.Join(f.options, ", "), s)
}

func (f *enumFlag) String() string { return *f.v }
