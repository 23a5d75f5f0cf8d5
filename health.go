package main

// The health endpoints: /-/healthy and /-/ready, on the metrics listeners
// and, with --web.health-address, on a listener of their own.

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/internal/connshed"
	"github.com/gpumem/gpumem_exporter/internal/fdbudget"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// listenHealth opens --web.health-address (capped at
// fdbudget.HealthMaxConnections); nil without the flag.
func listenHealth(o *options) (net.Listener, error) {
	if o.healthAddress == "" {
		return nil, nil
	}
	l, err := connshed.Listen(o.healthAddress, fdbudget.HealthMaxConnections)
	if err != nil {
		return nil, fmt.Errorf("--web.health-address=%s: %w", o.healthAddress, err)
	}
	return l, nil
}

// serveHealth serves d's health handler on its health listener, sending
// the end of serving to errc; nil without a health listener.
func serveHealth(d *daemon, errc chan<- error) *http.Server {
	if d.healthListener == nil {
		return nil
	}
	// Probes are a header and a line: every step has a short deadline,
	// and the listener's cap of fdbudget.HealthMaxConnections sheds as the
	// metrics listeners do.
	health := &http.Server{Handler: d.health, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second}
	connshed.Configure(health)
	go func() { errc <- health.Serve(d.healthListener) }()
	return health
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
