// Command gpumem_exporter tells where GPU memory went, process by process:
// NVML's per-GPU and per-process usage joined with the allocator statistics
// that instrumented processes push over a Unix socket, as Prometheus metrics.
//
// This file parses the flags and serves HTTP until a signal. wire.go wires
// sources (nvmlpoll, allocstats, workload, simulate; sources.go) -> one
// join (attribution) -> collectors, OOM reports (oom) and their outputs,
// foresight and the landing page (readers.go) -> HTTP; backend.go chooses
// the NVML library, filelimit.go fits the caps under the file limit, and
// health.go serves /-/healthy and /-/ready.
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
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/gpumem/gpumem_exporter/internal/authguard"
	"github.com/gpumem/gpumem_exporter/internal/connshed"
	"github.com/gpumem/gpumem_exporter/internal/logging"
	"github.com/gpumem/gpumem_exporter/internal/memtrim"
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
	health := serveHealth(d, errc)
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

// debugHandlers adds handlers for profiling; set only in a build with
// -tags pprof (pprof_build.go).
var debugHandlers func(*http.ServeMux)
