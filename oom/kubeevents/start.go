package kubeevents

import (
	"context"
	"fmt"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"

	"github.com/gpumem/gpumem_exporter/workload/pods"
)

// Start starts the recorder of the GPUOutOfMemory Events on pods when on
// (--kubernetes.oom-events, and the exporter talks to Kubernetes: the pod
// watch runs) and a Kubernetes configuration is found (kubeconfig, else
// in-cluster). Otherwise it returns nil, whose methods do nothing.
func Start(ctx context.Context, on bool, kubeconfig, nodeName string, logger log.Logger) (*Recorder, error) {
	if !on {
		return nil, nil
	}
	client, ok, err := pods.NewClient(kubeconfig, nil)
	if err != nil {
		return nil, fmt.Errorf("configuring the Kubernetes client for Events: %w", err)
	}
	if !ok {
		return nil, nil
	}
	rec, err := New(ctx, Config{Client: client, NodeName: nodeName, Logger: logger})
	if err != nil {
		return nil, err
	}
	level.Info(logger).Log("msg", "recording a Warning Event (reason "+Reason+") on the pod of each out-of-memory report; --no-kubernetes.oom-events turns it off")
	return rec, nil
}
