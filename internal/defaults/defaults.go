// Package defaults states the defaults of the flags that the programs'
// main packages own, once: gpumem_exporter's and gpumem-csi's flags take
// their defaults from here, and the deployment's checks
// (deploy/kubernetes/manifestcheck) hold the manifests to the same values.
// A flag of a package's own setting takes its default from that package's
// Default… constants instead (allocstats, oom, csi).
package defaults

// gpumem_exporter.
const (
	// MetricsPort is the port of --web.listen-address (":9481"), where the
	// metrics are served.
	MetricsPort = 9481
	// TelemetryPath is --web.telemetry-path.
	TelemetryPath = "/metrics"
	// ProcPath is --path.procfs: the host's procfs where the exporter runs
	// in the host PID namespace.
	ProcPath = "/proc"
)

// gpumem-csi.
const (
	// CSIHealthPort is the port of --csi.health-address (":9810").
	CSIHealthPort = 9810
	// KubeletDir is the kubelet's default root directory.
	KubeletDir = "/var/lib/kubelet"
	// CSIPodsDir is --csi.pods-dir: the kubelet's pods directory.
	CSIPodsDir = KubeletDir + "/pods"
	// CSIClientDir is --csi.client-dir: where the image holds the Python
	// client.
	CSIClientDir = "/opt/gpumem/clients"
	// NonRootID is the uid and gid of --csi.publish-dir-owner: the image's
	// user, distroless's "nonroot", as which the exporter container runs
	// where gpumem-csi owns the socket directory for it.
	NonRootID = 65532
)
