package main

import (
	"context"
	"fmt"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/workload"
)

// podLookup starts the pod informer when the exporter runs in Kubernetes
// (or a kubeconfig is given); outside Kubernetes attribution stays off.
func podLookup(ctx context.Context, o *options, logger log.Logger, reg prometheus.Registerer) (workload.PodLookup, error) {
	client, ok, err := workload.NewClient(o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("configuring the Kubernetes client: %w", err)
	}
	if !ok {
		level.Debug(logger).Log("msg", "not in Kubernetes and no --kubernetes.kubeconfig: pod attribution is off")
		return nil, nil
	}
	if o.nodeName == "" {
		return nil, fmt.Errorf("--kubernetes.node-name (or NODE_NAME) is required for pod attribution")
	}
	inf := workload.NewPodInformer(client, o.nodeName, log.With(logger, "component", "kubernetes"), reg)
	inf.Run(ctx)
	level.Info(logger).Log("msg", "watching this node's pods for attribution", "node", o.nodeName)
	return inf, nil
}
