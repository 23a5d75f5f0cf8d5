// Package workload says what a GPU process is: its name, owner, container,
// Kubernetes pod and Slurm job. It reads /proc off the scrape path, when the
// poller sees a pid that is new or reused, and serves lookups from a cache.
package workload

import "os"

// Info is what is known about one process. Empty strings mean unknown.
type Info struct {
	PID uint32
	// StartTime is field 22 of /proc/<pid>/stat (clock ticks since boot);
	// together with PID it names one process for its whole life.
	StartTime   uint64
	Comm        string
	UID         string // real uid, decimal
	Cgroup      string // the process's cgroup path (v2 unified, or the v1 path that named a container)
	ContainerID string
	PodUID      string
	SlurmJobID  string
	Namespace   string
	Pod         string
	Container   string
}

// PodLookup names the Kubernetes objects that cgroup IDs point to.
// Implementations answer from memory and never block on the API server.
type PodLookup interface {
	// Pod returns the namespace and name of the pod with this UID.
	Pod(podUID string) (namespace, name string, ok bool)
	// Container returns the name of the container with this runtime ID
	// (the hex ID, without a "containerd://" scheme) and the UID of the
	// pod whose status lists it, as the kubelet names the pod's cgroup (a
	// static pod's own UID, not its mirror pod's).
	Container(containerID string) (podUID, name string, ok bool)
}

// NodeName is the name of this node in workload names: name (the
// --kubernetes.node-name flag) where set, else the host name.
func NodeName(name string) string {
	if name != "" {
		return name
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "localhost"
}
