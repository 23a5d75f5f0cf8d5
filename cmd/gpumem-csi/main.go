// Command gpumem-csi is the CSI node plugin that hands the gpumem allocator
// socket and the zero-code Python client to workload pods: an inline
// ephemeral csi: volume, mounted read-only, which Pod Security "restricted"
// admits where it forbids a hostPath. See docs/csi.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/common/version"
	"google.golang.org/grpc"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"github.com/gpumem/gpumem_exporter/csi"
	"github.com/gpumem/gpumem_exporter/internal/defaults"
)

const programName = "gpumem-csi"

// shutdownGrace bounds the wait for in-flight CSI calls and health requests
// at shutdown.
const shutdownGrace = 5 * time.Second

type options struct {
	endpoint      string
	driverName    string
	nodeID        string
	publishDir    string
	podsDir       string
	clientDir     string
	owner         string
	healthAddress string
	logLevel      string
	logFormat     string
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	app := kingpin.New(programName, "CSI node plugin for inline ephemeral volumes: bind-mounts the gpumem publish directory (allocator socket and Python client) read-only into pods.")
	app.Flag("csi.endpoint", "CSI endpoint to serve (a Unix socket), where node-driver-registrar and the kubelet find the plugin.").Default(csi.DefaultEndpoint).StringVar(&o.endpoint)
	app.Flag("csi.driver-name", "CSI driver name; the CSIDriver object and the pods' csi: volumes use the same.").Default(csi.DefaultDriverName).StringVar(&o.driverName)
	app.Flag("csi.node-id", "This node's id, reported by NodeGetInfo (the Kubernetes node name).").Envar("NODE_NAME").Required().StringVar(&o.nodeID)
	app.Flag("csi.publish-dir", "Host directory bind-mounted read-only into each pod, root's: the Python client, the socket directory "+csi.SocketDir+"/ where the exporter creates "+csi.SocketName+", and a link "+csi.SocketName+" to it.").Default(wire.DefaultSocketDir).StringVar(&o.publishDir)
	app.Flag("csi.pods-dir", "The kubelet's pods directory (<kubelet root-dir>/pods): volumes are published and unpublished only below it.").Default(defaults.CSIPodsDir).StringVar(&o.podsDir)
	app.Flag("csi.client-dir", "Directory holding the Python client (gpumem/ and autostart/), copied at startup to <publish-dir>/"+csi.ClientsDir+"/; empty: copy nothing.").Default(defaults.CSIClientDir).StringVar(&o.clientDir)
	app.Flag("csi.publish-dir-owner", "uid:gid given at startup to the socket directory <publish-dir>/"+csi.SocketDir+" (the rest of the publish directory is root's), so that the exporter container can run as that user; empty: leave it root's.").Default(fmt.Sprintf("%d:%d", defaults.NonRootID, defaults.NonRootID)).StringVar(&o.owner)
	app.Flag("csi.health-address", "Address of the plain-HTTP liveness endpoint /-/healthy.").Default(fmt.Sprintf(":%d", defaults.CSIHealthPort)).StringVar(&o.healthAddress)
	app.Flag("log.level", "Only log messages with the given severity or above: debug, info, warn, error.").Default("info").EnumVar(&o.logLevel, "debug", "info", "warn", "error")
	app.Flag("log.format", "Output format of log messages: logfmt, json.").Default("logfmt").EnumVar(&o.logFormat, "logfmt", "json")
	app.Version(version.Print(programName))
	app.HelpFlag.Short('h')
	if _, err := app.Parse(args); err != nil {
		return nil, err
	}
	if o.nodeID == "" {
		return nil, errors.New("--csi.node-id (or NODE_NAME) is empty")
	}
	if _, _, _, err := csi.ParseOwner(o.owner); err != nil {
		return nil, fmt.Errorf("--csi.publish-dir-owner: %w", err)
	}
	if _, err := csi.SocketPath(o.endpoint); err != nil {
		return nil, fmt.Errorf("--csi.endpoint: %w", err)
	}
	return o, nil
}

func init() {
	if version.Version == "" {
		version.Version = "0.1.0-dev"
	}
}

func newLogger(o *options) log.Logger {
	var logger log.Logger
	if o.logFormat == "json" {
		logger = log.NewJSONLogger(log.NewSyncWriter(os.Stderr))
	} else {
		logger = log.NewLogfmtLogger(log.NewSyncWriter(os.Stderr))
	}
	logger = level.NewFilter(logger, level.Allow(level.ParseDefault(o.logLevel, level.InfoValue())))
	return log.With(logger, "ts", log.DefaultTimestampUTC, "caller", log.DefaultCaller)
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", programName, err)
		os.Exit(2)
	}
	logger := newLogger(o)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	p, err := start(o, csi.NewMounter(), logger)
	if err == nil {
		err = p.serve(ctx)
	}
	if err != nil {
		level.Error(logger).Log("msg", "exiting", "err", err)
		os.Exit(1)
	}
}

// plugin is a started plugin: its endpoints listen, nothing is served yet.
type plugin struct {
	logger     log.Logger
	socket     string
	csiLis     net.Listener
	grpc       *grpc.Server
	healthLis  net.Listener
	healthSrv  *http.Server
	healthAddr net.Addr
}

// start prepares the publish directory, installs the client and opens both
// endpoints.
func start(o *options, mounter csi.Mounter, logger log.Logger) (*plugin, error) {
	level.Info(logger).Log("msg", "starting "+programName, "version", version.Info(), "build_context", version.BuildContext())
	if err := csi.PreparePublishDir(o.publishDir, o.owner); err != nil {
		return nil, err
	}
	if o.clientDir != "" {
		if err := csi.InstallClients(o.clientDir, o.publishDir); err != nil {
			return nil, err
		}
		level.Info(logger).Log("msg", "Python client installed", "from", o.clientDir, "to", o.publishDir+"/"+csi.ClientsDir)
	}
	d, err := csi.NewDriver(csi.Config{
		Name:       o.driverName,
		Version:    version.Version,
		NodeID:     o.nodeID,
		PublishDir: o.publishDir,
		PodsDir:    o.podsDir,
		Mounter:    mounter,
		Logger:     log.With(logger, "component", "csi"),
	})
	if err != nil {
		return nil, err
	}
	socket, _ := csi.SocketPath(o.endpoint) // checked by parseFlags
	healthLis, err := net.Listen("tcp", o.healthAddress)
	if err != nil {
		return nil, fmt.Errorf("health endpoint: %w", err)
	}
	csiLis, err := csi.Listen(o.endpoint)
	if err != nil {
		healthLis.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "Healthy.")
	})
	return &plugin{
		logger:     logger,
		socket:     socket,
		csiLis:     csiLis,
		grpc:       csi.NewGRPCServer(d, log.With(logger, "component", "grpc")),
		healthLis:  healthLis,
		healthSrv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		healthAddr: healthLis.Addr(),
	}, nil
}

// serve serves both endpoints until ctx is done or one fails, then stops
// both and removes the socket.
func (p *plugin) serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	healthErr := make(chan error, 1)
	go func() {
		err := p.healthSrv.Serve(p.healthLis)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			cancel()
		}
		healthErr <- err
	}()
	level.Info(p.logger).Log("msg", "serving", "endpoint", "unix://"+p.socket, "health", p.healthAddr.String())
	err := csi.Serve(ctx, p.csiLis, p.grpc, shutdownGrace)
	shutdownCtx, done := context.WithTimeout(context.Background(), shutdownGrace)
	defer done()
	if serr := p.healthSrv.Shutdown(shutdownCtx); serr != nil {
		p.healthSrv.Close()
	}
	if herr := <-healthErr; herr != nil && err == nil {
		err = fmt.Errorf("health endpoint: %w", herr)
	}
	if rerr := os.Remove(p.socket); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		level.Warn(p.logger).Log("msg", "removing the socket", "err", rerr)
	}
	level.Info(p.logger).Log("msg", "stopped")
	return err
}
