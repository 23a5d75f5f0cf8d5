package pods

import (
	"context"
	"fmt"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
)

// Config says how to reach the API server and which node's pods to watch.
type Config struct {
	// Kubeconfig, when not empty, is used; else the in-cluster
	// configuration when running in a pod; else there is no watch.
	Kubeconfig string
	NodeName   string
}

// Start begins watching this node's pods when the exporter runs in
// Kubernetes (or a kubeconfig is given). Outside Kubernetes it returns nil
// and no error: pod attribution is off.
func Start(ctx context.Context, cfg Config, logger log.Logger) (*Informer, error) {
	inf := New(cfg.NodeName, logger)
	client, ok, err := NewClient(cfg.Kubeconfig, inf.RequestFailed)
	if err != nil {
		return nil, fmt.Errorf("configuring the Kubernetes client: %w", err)
	}
	if !ok {
		level.Debug(logger).Log("msg", "not in Kubernetes and no --kubernetes.kubeconfig: pod attribution is off")
		return nil, nil
	}
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("--kubernetes.node-name (or NODE_NAME) is required for pod attribution")
	}
	inf.Run(ctx, PodListWatch(client, cfg.NodeName))
	level.Info(logger).Log("msg", "watching this node's pods for attribution", "node", cfg.NodeName)
	return inf, nil
}
