package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/gpumem/gpumem_exporter/workload"
)

// podLookup starts the pod informer when the exporter runs in Kubernetes
// (or a kubeconfig is given); outside Kubernetes attribution stays off.
func podLookup(ctx context.Context, o *options, logger, bare log.Logger, reg prometheus.Registerer) (workload.PodLookup, error) {
	// Failed requests are counted by the informer, which exists only once
	// the client does; nothing requests before inf.Run.
	var inf atomic.Pointer[workload.PodInformer]
	client, ok, err := workload.NewClient(o.kubeconfig, func(err error) {
		if p := inf.Load(); p != nil {
			p.RequestFailed(err)
		}
	})
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
	// client-go logs through klog; send it to the project's logger so that
	// its lines have the same format and level filter.
	klog.SetSlogLogger(slogkitLogger(log.With(bare, "component", "client-go")))
	pods := workload.NewPodInformer(client, o.nodeName, log.With(logger, "component", "kubernetes"), reg)
	inf.Store(pods)
	pods.Run(ctx)
	level.Info(logger).Log("msg", "watching this node's pods for attribution", "node", o.nodeName)
	return pods, nil
}
