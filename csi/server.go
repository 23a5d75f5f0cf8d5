package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// DefaultEndpoint is where the node-driver-registrar sidecar and the kubelet
// expect the plugin: the chart mounts the host's
// /var/lib/kubelet/plugins/<driver name>/ at /csi.
const DefaultEndpoint = "unix:///csi/csi.sock"

// SocketPath returns the file path of a unix:// endpoint ("unix:///csi/csi.sock",
// "unix:/csi/csi.sock" or a bare absolute path).
func SocketPath(endpoint string) (string, error) {
	p := endpoint
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	case strings.Contains(p, "://"):
		return "", fmt.Errorf("endpoint %q: only unix sockets are served", endpoint)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("endpoint %q: the socket path must be absolute", endpoint)
	}
	return filepath.Clean(p), nil
}

// Listen creates the endpoint's Unix socket, replacing a stale socket left
// by an earlier run (and nothing else: a regular file there is an error).
func Listen(endpoint string) (net.Listener, error) {
	p, err := SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return nil, fmt.Errorf("creating the socket directory: %w", err)
	}
	if fi, err := os.Lstat(p); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", p)
		}
		if err := os.Remove(p); err != nil {
			return nil, fmt.Errorf("removing the stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", p)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", p, err)
	}
	return l, nil
}

// NewGRPCServer returns a gRPC server with the driver's Identity and Node
// services, logging every call at debug level and every failure at warn.
func NewGRPCServer(d *Driver, logger log.Logger) *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(logCalls(logger)))
	csipb.RegisterIdentityServer(srv, d)
	csipb.RegisterNodeServer(srv, d)
	return srv
}

// Serve serves the driver on l until ctx is done, then stops: gracefully
// for up to grace, then at once. It returns nil after a stop through ctx.
func Serve(ctx context.Context, l net.Listener, srv *grpc.Server, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving CSI: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		srv.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving CSI: %w", err)
	}
	return nil
}

func logCalls(logger log.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		if err != nil {
			level.Warn(logger).Log("msg", "CSI call failed", "method", info.FullMethod, "code", status.Code(err), "err", err)
		} else {
			level.Debug(logger).Log("msg", "CSI call", "method", info.FullMethod, "duration", time.Since(start))
		}
		return resp, err
	}
}
