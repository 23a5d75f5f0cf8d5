package manifestcheck

import (
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The contract's fixed names and paths.
const (
	ExporterContainer  = "gpumem-exporter"
	CSIContainer       = "csi-node"
	RegistrarContainer = "node-driver-registrar"
	SocketDir          = "/run/gpumem"
	Socket             = SocketDir + "/allocstats.sock"
	MetricsPort        = 9481
	HealthPort         = 9482
	CSIHealthPort      = 9810
	RegistrarImage     = "registry.k8s.io/sig-storage/csi-node-driver-registrar"
	DefaultDriverName  = "csi.gpumem.io"
	DefaultKubeletDir  = "/var/lib/kubelet"
	// NonRootID is the exporter's uid and gid where the CSI container owns
	// the socket directory for it (distroless's "nonroot").
	NonRootID = 65532
)

// DaemonSetWant is what a rendering of the DaemonSet must hold beyond the
// fixed contract. Zero fields take the defaults.
type DaemonSetWant struct {
	// CSI: the csi-node sidecar and the registrar are there, and the
	// exporter runs as NonRootID; otherwise neither is, and the exporter
	// runs as root.
	CSI               bool
	Image             string // the exporter's (and csi-node's) image; "" any
	RegistrarImage    string // "" any RegistrarImage:v2.*
	DriverName        string
	KubeletDir        string
	PriorityClassName string // "" system-node-critical
	// Resources of the exporter; nil: requests cpu 50m memory 96Mi, limit
	// memory 256Mi.
	Resources *corev1.ResourceRequirements
	// ExtraArgs are flags expected beyond the contract's three.
	ExtraArgs []string
}

func (w DaemonSetWant) driver() string {
	if w.DriverName == "" {
		return DefaultDriverName
	}
	return w.DriverName
}

func (w DaemonSetWant) kubeletDir() string {
	if w.KubeletDir == "" {
		return DefaultKubeletDir
	}
	return w.KubeletDir
}

// PluginDir is the host directory of the CSI plugin's socket.
func (w DaemonSetWant) PluginDir() string {
	return path.Join(w.kubeletDir(), "plugins", w.driver())
}

// DefaultExporterResources are the measured figures (docs/deploy.md):
// 28-33 MiB RSS on an H200 node (44-48 MiB with
// --no-runtime.release-startup-pages).
func DefaultExporterResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("50m"),
			corev1.ResourceMemory: resource.MustParse("96Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		},
	}
}

// ExporterArgs are the flags the contract passes to gpumem_exporter.
func ExporterArgs() []string {
	return []string{
		"--allocstats.socket=" + Socket,
		"--web.listen-address=:9481",
		"--web.health-address=:9482",
	}
}

// CSIArgs are the flags the contract passes to gpumem-csi.
func CSIArgs(driver, podsDir string) []string {
	return []string{
		"--csi.endpoint=unix:///csi/csi.sock",
		"--csi.driver-name=" + driver,
		"--csi.publish-dir=" + SocketDir,
		"--csi.pods-dir=" + podsDir,
		"--csi.client-dir=/opt/gpumem/clients",
		"--csi.publish-dir-owner=65532:65532",
		"--csi.health-address=:9810",
	}
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// Exporter returns the DaemonSet's exporter container, failing t if absent.
func Exporter(t testing.TB, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	c := container(ds.Spec.Template.Spec.Containers, ExporterContainer)
	if c == nil {
		t.Fatalf("the DaemonSet has no container %s (has %v)", ExporterContainer, names(ds.Spec.Template.Spec.Containers))
	}
	return c
}

func volume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// MountAt returns c's mount at mountPath and its volume, failing t if there
// is none.
func MountAt(t testing.TB, spec *corev1.PodSpec, c *corev1.Container, mountPath string) (*corev1.VolumeMount, *corev1.Volume) {
	t.Helper()
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == mountPath {
			v := volume(spec, c.VolumeMounts[i].Name)
			if v == nil {
				t.Fatalf("container %s mounts volume %q, which the pod does not define", c.Name, c.VolumeMounts[i].Name)
			}
			return &c.VolumeMounts[i], v
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, mountPath)
	return nil, nil
}

// Env returns c's variable name, or nil.
func Env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func checkHostPath(t testing.TB, what string, v *corev1.Volume, hostPath string, typ corev1.HostPathType) {
	t.Helper()
	if v.HostPath == nil {
		t.Errorf("%s: volume %s must be hostPath %s, got %+v", what, v.Name, hostPath, v.VolumeSource)
		return
	}
	if path.Clean(v.HostPath.Path) != path.Clean(hostPath) {
		t.Errorf("%s: volume %s is hostPath %s, want %s", what, v.Name, v.HostPath.Path, hostPath)
	}
	if v.HostPath.Type == nil || *v.HostPath.Type != typ {
		t.Errorf("%s: hostPath %s has type %v, want %s", what, v.HostPath.Path, v.HostPath.Type, typ)
	}
}

func portNumber(c *corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// checkHTTPProbe checks that probe is an HTTP GET of path on port (a number),
// and, where portName is set, that it names the port portName.
func checkHTTPProbe(t testing.TB, c *corev1.Container, kind string, probe *corev1.Probe, urlPath string, port int32, portName string) {
	t.Helper()
	if probe == nil || probe.HTTPGet == nil {
		t.Errorf("container %s: no HTTP %s probe", c.Name, kind)
		return
	}
	g := probe.HTTPGet
	if g.Path != urlPath {
		t.Errorf("container %s: %s probe path %s, want %s", c.Name, kind, g.Path, urlPath)
	}
	if portName != "" && g.Port != intstr.FromString(portName) {
		t.Errorf("container %s: %s probe on port %s, want the port named %s", c.Name, kind, g.Port.String(), portName)
	}
	if got := portNumber(c, g.Port); got != port {
		t.Errorf("container %s: %s probe on port %s (%d), want %d", c.Name, kind, g.Port.String(), got, port)
	}
	if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
		t.Errorf("container %s: %s probe scheme %s, want HTTP", c.Name, kind, g.Scheme)
	}
}

func checkPort(t testing.TB, c *corev1.Container, name string, number int32) {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			if p.ContainerPort != number {
				t.Errorf("container %s: port %s is %d, want %d", c.Name, name, p.ContainerPort, number)
			}
			return
		}
	}
	t.Errorf("container %s has no port named %s (%d)", c.Name, name, number)
}

func checkNodeName(t testing.TB, c *corev1.Container) {
	t.Helper()
	e := Env(c, "NODE_NAME")
	if e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("container %s: NODE_NAME must come from fieldRef spec.nodeName, got %+v", c.Name, e)
	}
}

// isTrue and isFalse read optional booleans.
func isTrue(b *bool) bool  { return b != nil && *b }
func isFalse(b *bool) bool { return b != nil && !*b }

func checkUnprivileged(t testing.TB, c *corev1.Container, podSC *corev1.PodSecurityContext) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("container %s has no securityContext", c.Name)
		return
	}
	if isTrue(sc.Privileged) {
		t.Errorf("container %s must not be privileged", c.Name)
	}
	if !isFalse(sc.AllowPrivilegeEscalation) {
		t.Errorf("container %s: set allowPrivilegeEscalation: false", c.Name)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("container %s: set readOnlyRootFilesystem: true", c.Name)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container %s: capabilities must drop ALL and add none, got %+v", c.Name, sc.Capabilities)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && podSC != nil {
		seccomp = podSC.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container %s: seccomp profile %+v, want RuntimeDefault", c.Name, seccomp)
	}
}

func checkUser(t testing.TB, c *corev1.Container, uid int64, nonRoot bool) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		return // reported by checkUnprivileged
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != uid || sc.RunAsGroup == nil || *sc.RunAsGroup != uid {
		t.Errorf("container %s: runAsUser %v runAsGroup %v, want %d:%d", c.Name, deref(sc.RunAsUser), deref(sc.RunAsGroup), uid, uid)
	}
	if isTrue(sc.RunAsNonRoot) != nonRoot {
		t.Errorf("container %s: runAsNonRoot %v, want %v", c.Name, deref(sc.RunAsNonRoot), nonRoot)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// CheckDaemonSet checks the DaemonSet against the contract of
// docs/deploy.md.
func CheckDaemonSet(t testing.TB, ds *appsv1.DaemonSet, want DaemonSetWant) {
	t.Helper()
	spec := &ds.Spec.Template.Spec

	if ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchExpressions) != 0 || !Selects(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("the DaemonSet's selector %+v does not select its own pod template %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	}
	if !spec.HostPID {
		t.Error("hostPID must be true: NVML and SO_PEERCRED give host pids")
	}
	if spec.HostNetwork || spec.HostIPC {
		t.Error("hostNetwork and hostIPC are not needed")
	}
	wantPriority := want.PriorityClassName
	if wantPriority == "" {
		wantPriority = "system-node-critical"
	}
	if spec.PriorityClassName != wantPriority {
		t.Errorf("priorityClassName %q, want %q", spec.PriorityClassName, wantPriority)
	}
	if spec.ServiceAccountName == "" {
		t.Error("no serviceAccountName: the exporter watches pods with its own account")
	}
	if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the pod's securityContext must set seccompProfile RuntimeDefault")
	}

	// hostPID makes /proc the host's: no /proc hostPath, no --path.procfs.
	for _, v := range spec.Volumes {
		if v.HostPath != nil && (path.Clean(v.HostPath.Path) == "/proc" || strings.HasPrefix(v.HostPath.Path, "/proc/")) {
			t.Errorf("volume %s mounts the host's %s: hostPID already makes /proc the host's", v.Name, v.HostPath.Path)
		}
	}

	// GPU nodes only, tainted or not.
	if len(spec.NodeSelector) == 0 && spec.Affinity == nil {
		t.Error("no nodeSelector or affinity: the exporter belongs on GPU nodes only")
	}
	tolerates := false
	for _, tol := range spec.Tolerations {
		if tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists &&
			(tol.Effect == "" || tol.Effect == corev1.TaintEffectNoSchedule) {
			tolerates = true
		}
	}
	if !tolerates {
		t.Error("no toleration for the nvidia.com/gpu NoSchedule taint")
	}

	// No container takes a GPU from the workloads.
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, rl := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range rl {
				if strings.HasPrefix(string(name), "nvidia.com/") {
					t.Errorf("container %s requests %s: the exporter would take a GPU from the workloads", c.Name, name)
				}
			}
		}
	}

	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		t.Errorf("update strategy %s, want RollingUpdate", ds.Spec.UpdateStrategy.Type)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || (ru.MaxSurge.String() != "0" && ru.MaxSurge.String() != "0%") {
		t.Error("set maxSurge: 0: two exporters cannot share a node's socket")
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 6 {
		t.Error("terminationGracePeriodSeconds must cover the exporter's 5 s HTTP shutdown")
	}

	socketVolume := checkExporter(t, ds, want)
	if want.CSI {
		checkCSIContainers(t, ds, want, socketVolume)
	} else {
		if len(spec.InitContainers) != 0 {
			t.Errorf("without CSI there are no init containers, found %v", names(spec.InitContainers))
		}
		if got := names(spec.Containers); !slices.Equal(got, []string{ExporterContainer}) {
			t.Errorf("without CSI the containers are [%s], got %v", ExporterContainer, got)
		}
	}
}

// checkExporter checks the exporter container and returns the name of its
// socket directory's volume.
func checkExporter(t testing.TB, ds *appsv1.DaemonSet, want DaemonSetWant) string {
	t.Helper()
	spec := &ds.Spec.Template.Spec
	c := Exporter(t, ds)
	if want.Image != "" && c.Image != want.Image {
		t.Errorf("exporter image %s, want %s", c.Image, want.Image)
	}
	if len(c.Command) != 0 {
		t.Errorf("the exporter container overrides the image's entrypoint: %q", c.Command)
	}
	if wantArgs := slices.Concat(ExporterArgs(), want.ExtraArgs); !slices.Equal(c.Args, wantArgs) {
		t.Errorf("exporter args %q, want %q", c.Args, wantArgs)
	}
	checkPort(t, c, "metrics", MetricsPort)
	checkPort(t, c, "health", HealthPort)
	// The probes use the health listener, which needs no TLS or basic auth.
	checkHTTPProbe(t, c, "readiness", c.ReadinessProbe, "/-/ready", HealthPort, "health")
	checkHTTPProbe(t, c, "liveness", c.LivenessProbe, "/-/healthy", HealthPort, "health")

	checkNodeName(t, c)
	if e := Env(c, "NVIDIA_VISIBLE_DEVICES"); e == nil || e.Value != "all" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES must be all, got %+v", e)
	}
	if e := Env(c, "NVIDIA_DRIVER_CAPABILITIES"); e == nil || e.Value != "utility" {
		t.Errorf("NVIDIA_DRIVER_CAPABILITIES must be utility, got %+v", e)
	}

	wantRes := DefaultExporterResources()
	if want.Resources != nil {
		wantRes = *want.Resources
	}
	checkResources(t, c, wantRes)

	checkUnprivileged(t, c, spec.SecurityContext)
	if want.CSI {
		checkUser(t, c, NonRootID, true)
	} else {
		checkUser(t, c, 0, false)
	}

	if len(c.VolumeMounts) != 1 {
		t.Errorf("the exporter mounts %d volumes, want only the socket directory", len(c.VolumeMounts))
	}
	mnt, vol := MountAt(t, spec, c, SocketDir)
	// With CSI, the exporter mounts only the publish directory's socket
	// directory: the rest (the client every pod imports) is root's.
	wantSub := ""
	if want.CSI {
		wantSub = "socket"
	}
	if mnt.ReadOnly || mnt.SubPath != wantSub {
		t.Errorf("mount the socket directory read-write (the exporter creates the socket) with subPath %q, got %+v", wantSub, mnt)
	}
	checkHostPath(t, "the socket directory", vol, SocketDir, corev1.HostPathDirectoryOrCreate)
	return vol.Name
}

func checkResources(t testing.TB, c *corev1.Container, want corev1.ResourceRequirements) {
	t.Helper()
	equal := func(a, b corev1.ResourceList) bool {
		if len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || v.Cmp(w) != 0 {
				return false
			}
		}
		return true
	}
	if !equal(c.Resources.Requests, want.Requests) || !equal(c.Resources.Limits, want.Limits) {
		t.Errorf("container %s: resources %v, want %v", c.Name, c.Resources, want)
	}
}

func checkCSIContainers(t testing.TB, ds *appsv1.DaemonSet, want DaemonSetWant, socketVolume string) {
	t.Helper()
	spec := &ds.Spec.Template.Spec
	exporter := Exporter(t, ds)

	// csi-node: a native sidecar, started (and probed) before the exporter.
	if got := names(spec.InitContainers); !slices.Equal(got, []string{CSIContainer}) {
		t.Fatalf("init containers %v, want [%s]", got, CSIContainer)
	}
	csi := &spec.InitContainers[0]
	if csi.RestartPolicy == nil || *csi.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s must be a native sidecar (restartPolicy: Always)", CSIContainer)
	}
	if csi.Image != exporter.Image {
		t.Errorf("%s runs image %s, the exporter %s: both binaries are in one image", CSIContainer, csi.Image, exporter.Image)
	}
	if !slices.Equal(csi.Command, []string{"/usr/local/bin/gpumem-csi"}) {
		t.Errorf("%s command %q, want /usr/local/bin/gpumem-csi", CSIContainer, csi.Command)
	}
	if wantArgs := CSIArgs(want.driver(), path.Join(want.kubeletDir(), "pods")); !slices.Equal(csi.Args, wantArgs) {
		t.Errorf("%s args %q, want %q", CSIContainer, csi.Args, wantArgs)
	}
	checkNodeName(t, csi)
	// The startup probe is what holds the exporter back until the
	// directory is its own.
	checkHTTPProbe(t, csi, "startup", csi.StartupProbe, "/-/healthy", CSIHealthPort, "")
	checkHTTPProbe(t, csi, "liveness", csi.LivenessProbe, "/-/healthy", CSIHealthPort, "")
	if sc := csi.SecurityContext; sc == nil || !isTrue(sc.Privileged) || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("%s must be privileged and run as uid 0 (bind mounts into pods, chown), got %+v", CSIContainer, sc)
	}
	if csi.Resources.Requests.Memory().IsZero() || csi.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: set a memory request and limit", CSIContainer)
	}

	mnt, vol := MountAt(t, spec, csi, SocketDir)
	if vol.Name != socketVolume || mnt.ReadOnly {
		t.Errorf("%s must mount the exporter's socket directory (volume %s) read-write at %s, got volume %s readOnly %v", CSIContainer, socketVolume, SocketDir, vol.Name, mnt.ReadOnly)
	}
	_, pluginVol := MountAt(t, spec, csi, "/csi")
	checkHostPath(t, "the CSI plugin directory", pluginVol, want.PluginDir(), corev1.HostPathDirectoryOrCreate)
	podsDir := path.Join(want.kubeletDir(), "pods")
	mnt, vol = MountAt(t, spec, csi, podsDir)
	checkHostPath(t, "the kubelet's pods directory", vol, podsDir, corev1.HostPathDirectory)
	if mnt.MountPropagation == nil || *mnt.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("%s: mount %s with mountPropagation Bidirectional, so that its bind mounts reach the kubelet", CSIContainer, podsDir)
	}

	// The registrar, an ordinary container beside the exporter.
	if got := names(spec.Containers); !slices.Equal(got, []string{ExporterContainer, RegistrarContainer}) {
		t.Fatalf("containers %v, want [%s %s]", got, ExporterContainer, RegistrarContainer)
	}
	reg := &spec.Containers[1]
	image, tag, _ := strings.Cut(reg.Image, ":")
	if want.RegistrarImage != "" {
		if reg.Image != want.RegistrarImage {
			t.Errorf("%s image %s, want %s", RegistrarContainer, reg.Image, want.RegistrarImage)
		}
	} else if image != RegistrarImage || !strings.HasPrefix(tag, "v2.") {
		t.Errorf("%s image %s, want %s pinned to a v2 tag", RegistrarContainer, reg.Image, RegistrarImage)
	}
	for _, a := range []string{"--csi-address=/csi/csi.sock", "--kubelet-registration-path=" + want.PluginDir() + "/csi.sock"} {
		if !slices.Contains(reg.Args, a) {
			t.Errorf("%s args %q lack %s", RegistrarContainer, reg.Args, a)
		}
	}
	checkUnprivileged(t, reg, spec.SecurityContext)
	_, regPluginVol := MountAt(t, spec, reg, "/csi")
	if regPluginVol.Name != pluginVol.Name {
		t.Errorf("%s mounts volume %s at /csi, %s mounts %s: they must share the plugin's socket", RegistrarContainer, regPluginVol.Name, CSIContainer, pluginVol.Name)
	}
	_, regVol := MountAt(t, spec, reg, "/registration")
	checkHostPath(t, "the kubelet's plugin registry", regVol, path.Join(want.kubeletDir(), "plugins_registry"), corev1.HostPathDirectory)
}
