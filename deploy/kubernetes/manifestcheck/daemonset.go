package manifestcheck

import (
	"fmt"
	"path"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/csi"
	"github.com/gpumem/gpumem_exporter/internal/defaults"
)

// The contract's fixed names, ports and paths. Where the contract passes
// a flag its default value, the value is taken from where the flag takes
// its default.
const (
	ExporterContainer  = "gpumem-exporter"
	CSIContainer       = "csi-node"
	RegistrarContainer = "node-driver-registrar"
	// Socket is the exporter's socket (--allocstats.socket), where the
	// workloads find it too (GPUMEM_SOCKET).
	Socket      = allocstats.DefaultSocketPath
	MetricsPort = defaults.MetricsPort
	// HealthPort is the exporter's --web.health-address, which is off
	// unless given: the probes' port.
	HealthPort        = 9482
	CSIHealthPort     = defaults.CSIHealthPort
	RegistrarImage    = "registry.k8s.io/sig-storage/csi-node-driver-registrar"
	DefaultDriverName = csi.DefaultDriverName
	DefaultKubeletDir = defaults.KubeletDir
	// NonRootID is the exporter's uid and gid where the CSI container owns
	// the socket directory for it (distroless's "nonroot").
	NonRootID = defaults.NonRootID
)

// SocketDir is Socket's directory: the exporter's and the workloads'
// containers mount the socket directory there.
var SocketDir = path.Dir(Socket)

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
		fmt.Sprintf("--web.listen-address=:%d", MetricsPort),
		fmt.Sprintf("--web.health-address=:%d", HealthPort),
	}
}

// CSIArgs are the flags the contract passes to gpumem-csi.
func CSIArgs(driver, podsDir string) []string {
	return []string{
		"--csi.endpoint=" + csi.DefaultEndpoint,
		"--csi.driver-name=" + driver,
		"--csi.publish-dir=" + SocketDir,
		"--csi.pods-dir=" + podsDir,
		"--csi.client-dir=" + defaults.CSIClientDir,
		fmt.Sprintf("--csi.publish-dir-owner=%d:%d", NonRootID, NonRootID),
		fmt.Sprintf("--csi.health-address=:%d", CSIHealthPort),
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

// Exporter returns the DaemonSet's exporter container, or an error if it
// has none.
func Exporter(ds *appsv1.DaemonSet) (*corev1.Container, error) {
	c := container(ds.Spec.Template.Spec.Containers, ExporterContainer)
	if c == nil {
		return nil, fmt.Errorf("the DaemonSet has no container %s (has %v)", ExporterContainer, names(ds.Spec.Template.Spec.Containers))
	}
	return c, nil
}

func volume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}

// mountAt returns c's mount at mountPath and its volume; where there is
// none, it adds that to p and returns ok false.
func mountAt(p *problems, spec *corev1.PodSpec, c *corev1.Container, mountPath string) (_ *corev1.VolumeMount, _ *corev1.Volume, ok bool) {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == mountPath {
			v := volume(spec, c.VolumeMounts[i].Name)
			if v == nil {
				p.addf("container %s mounts volume %q, which the pod does not define", c.Name, c.VolumeMounts[i].Name)
				return nil, nil, false
			}
			return &c.VolumeMounts[i], v, true
		}
	}
	p.addf("container %s mounts nothing at %s", c.Name, mountPath)
	return nil, nil, false
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

func checkHostPath(p *problems, what string, v *corev1.Volume, hostPath string, typ corev1.HostPathType) {
	if v.HostPath == nil {
		p.addf("%s: volume %s must be hostPath %s, got %+v", what, v.Name, hostPath, v.VolumeSource)
		return
	}
	if path.Clean(v.HostPath.Path) != path.Clean(hostPath) {
		p.addf("%s: volume %s is hostPath %s, want %s", what, v.Name, v.HostPath.Path, hostPath)
	}
	if v.HostPath.Type == nil || *v.HostPath.Type != typ {
		p.addf("%s: hostPath %s has type %v, want %s", what, v.HostPath.Path, v.HostPath.Type, typ)
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
func checkHTTPProbe(p *problems, c *corev1.Container, kind string, probe *corev1.Probe, urlPath string, port int32, portName string) {
	if probe == nil || probe.HTTPGet == nil {
		p.addf("container %s: no HTTP %s probe", c.Name, kind)
		return
	}
	g := probe.HTTPGet
	if g.Path != urlPath {
		p.addf("container %s: %s probe path %s, want %s", c.Name, kind, g.Path, urlPath)
	}
	if portName != "" && g.Port != intstr.FromString(portName) {
		p.addf("container %s: %s probe on port %s, want the port named %s", c.Name, kind, g.Port.String(), portName)
	}
	if got := portNumber(c, g.Port); got != port {
		p.addf("container %s: %s probe on port %s (%d), want %d", c.Name, kind, g.Port.String(), got, port)
	}
	if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
		p.addf("container %s: %s probe scheme %s, want HTTP", c.Name, kind, g.Scheme)
	}
}

func checkPort(p *problems, c *corev1.Container, name string, number int32) {
	for _, port := range c.Ports {
		if port.Name == name {
			if port.ContainerPort != number {
				p.addf("container %s: port %s is %d, want %d", c.Name, name, port.ContainerPort, number)
			}
			return
		}
	}
	p.addf("container %s has no port named %s (%d)", c.Name, name, number)
}

func checkNodeName(p *problems, c *corev1.Container) {
	e := Env(c, "NODE_NAME")
	if e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		p.addf("container %s: NODE_NAME must come from fieldRef spec.nodeName, got %+v", c.Name, e)
	}
}

// isTrue and isFalse read optional booleans.
func isTrue(b *bool) bool  { return b != nil && *b }
func isFalse(b *bool) bool { return b != nil && !*b }

func checkUnprivileged(p *problems, c *corev1.Container, podSC *corev1.PodSecurityContext) {
	sc := c.SecurityContext
	if sc == nil {
		p.addf("container %s has no securityContext", c.Name)
		return
	}
	if isTrue(sc.Privileged) {
		p.addf("container %s must not be privileged", c.Name)
	}
	if !isFalse(sc.AllowPrivilegeEscalation) {
		p.addf("container %s: set allowPrivilegeEscalation: false", c.Name)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		p.addf("container %s: set readOnlyRootFilesystem: true", c.Name)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		p.addf("container %s: capabilities must drop ALL and add none, got %+v", c.Name, sc.Capabilities)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && podSC != nil {
		seccomp = podSC.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.addf("container %s: seccomp profile %+v, want RuntimeDefault", c.Name, seccomp)
	}
}

func checkUser(p *problems, c *corev1.Container, uid int64, nonRoot bool) {
	sc := c.SecurityContext
	if sc == nil {
		return // reported by checkUnprivileged
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != uid || sc.RunAsGroup == nil || *sc.RunAsGroup != uid {
		p.addf("container %s: runAsUser %v runAsGroup %v, want %d:%d", c.Name, deref(sc.RunAsUser), deref(sc.RunAsGroup), uid, uid)
	}
	if isTrue(sc.RunAsNonRoot) != nonRoot {
		p.addf("container %s: runAsNonRoot %v, want %v", c.Name, deref(sc.RunAsNonRoot), nonRoot)
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
func CheckDaemonSet(ds *appsv1.DaemonSet, want DaemonSetWant) error {
	var p problems
	spec := &ds.Spec.Template.Spec

	if ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchExpressions) != 0 || !Selects(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		p.addf("the DaemonSet's selector %+v does not select its own pod template %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	}
	if !spec.HostPID {
		p.addf("hostPID must be true: NVML and SO_PEERCRED give host pids")
	}
	if spec.HostNetwork || spec.HostIPC {
		p.addf("hostNetwork and hostIPC are not needed")
	}
	wantPriority := want.PriorityClassName
	if wantPriority == "" {
		wantPriority = "system-node-critical"
	}
	if spec.PriorityClassName != wantPriority {
		p.addf("priorityClassName %q, want %q", spec.PriorityClassName, wantPriority)
	}
	if spec.ServiceAccountName == "" {
		p.addf("no serviceAccountName: the exporter watches pods with its own account")
	}
	if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.addf("the pod's securityContext must set seccompProfile RuntimeDefault")
	}

	// hostPID makes the exporter's procfs (--path.procfs's default) the
	// host's: no hostPath of it, no --path.procfs.
	for _, v := range spec.Volumes {
		if v.HostPath != nil && (path.Clean(v.HostPath.Path) == defaults.ProcPath || strings.HasPrefix(v.HostPath.Path, defaults.ProcPath+"/")) {
			p.addf("volume %s mounts the host's %s: hostPID already makes %s the host's", v.Name, v.HostPath.Path, defaults.ProcPath)
		}
	}

	// GPU nodes only, tainted or not.
	if len(spec.NodeSelector) == 0 && spec.Affinity == nil {
		p.addf("no nodeSelector or affinity: the exporter belongs on GPU nodes only")
	}
	tolerates := false
	for _, tol := range spec.Tolerations {
		if tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists &&
			(tol.Effect == "" || tol.Effect == corev1.TaintEffectNoSchedule) {
			tolerates = true
		}
	}
	if !tolerates {
		p.addf("no toleration for the nvidia.com/gpu NoSchedule taint")
	}

	// No container takes a GPU from the workloads.
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, rl := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range rl {
				if strings.HasPrefix(string(name), "nvidia.com/") {
					p.addf("container %s requests %s: the exporter would take a GPU from the workloads", c.Name, name)
				}
			}
		}
	}

	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		p.addf("update strategy %s, want RollingUpdate", ds.Spec.UpdateStrategy.Type)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || (ru.MaxSurge.String() != "0" && ru.MaxSurge.String() != "0%") {
		p.addf("set maxSurge: 0: two exporters cannot share a node's socket")
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 6 {
		p.addf("terminationGracePeriodSeconds must cover the exporter's 5 s HTTP shutdown")
	}

	socketVolume, ok := checkExporter(&p, ds, want)
	if !ok {
		return p.err()
	}
	if want.CSI {
		checkCSIContainers(&p, ds, want, socketVolume)
	} else {
		if len(spec.InitContainers) != 0 {
			p.addf("without CSI there are no init containers, found %v", names(spec.InitContainers))
		}
		if got := names(spec.Containers); !slices.Equal(got, []string{ExporterContainer}) {
			p.addf("without CSI the containers are [%s], got %v", ExporterContainer, got)
		}
	}
	return p.err()
}

// checkExporter checks the exporter container and returns the name of its
// socket directory's volume; ok is false where the exporter container or
// that volume is missing, which leaves nothing further to check.
func checkExporter(p *problems, ds *appsv1.DaemonSet, want DaemonSetWant) (socketVolume string, ok bool) {
	spec := &ds.Spec.Template.Spec
	c, err := Exporter(ds)
	if err != nil {
		p.add(err)
		return "", false
	}
	if want.Image != "" && c.Image != want.Image {
		p.addf("exporter image %s, want %s", c.Image, want.Image)
	}
	if len(c.Command) != 0 {
		p.addf("the exporter container overrides the image's entrypoint: %q", c.Command)
	}
	if wantArgs := slices.Concat(ExporterArgs(), want.ExtraArgs); !slices.Equal(c.Args, wantArgs) {
		p.addf("exporter args %q, want %q", c.Args, wantArgs)
	}
	checkPort(p, c, "metrics", MetricsPort)
	checkPort(p, c, "health", HealthPort)
	// The probes use the health listener, which needs no TLS or basic auth.
	checkHTTPProbe(p, c, "readiness", c.ReadinessProbe, "/-/ready", HealthPort, "health")
	checkHTTPProbe(p, c, "liveness", c.LivenessProbe, "/-/healthy", HealthPort, "health")

	checkNodeName(p, c)
	if e := Env(c, "NVIDIA_VISIBLE_DEVICES"); e == nil || e.Value != "all" {
		p.addf("NVIDIA_VISIBLE_DEVICES must be all, got %+v", e)
	}
	if e := Env(c, "NVIDIA_DRIVER_CAPABILITIES"); e == nil || e.Value != "utility" {
		p.addf("NVIDIA_DRIVER_CAPABILITIES must be utility, got %+v", e)
	}

	wantRes := DefaultExporterResources()
	if want.Resources != nil {
		wantRes = *want.Resources
	}
	checkResources(p, c, wantRes)

	checkUnprivileged(p, c, spec.SecurityContext)
	if want.CSI {
		checkUser(p, c, NonRootID, true)
	} else {
		checkUser(p, c, 0, false)
	}

	if len(c.VolumeMounts) != 1 {
		p.addf("the exporter mounts %d volumes, want only the socket directory", len(c.VolumeMounts))
	}
	mnt, vol, ok := mountAt(p, spec, c, SocketDir)
	if !ok {
		return "", false
	}
	// With CSI, the exporter mounts only the publish directory's socket
	// directory: the rest (the client every pod imports) is root's.
	wantSub := ""
	if want.CSI {
		wantSub = csi.SocketDir
	}
	if mnt.ReadOnly || mnt.SubPath != wantSub {
		p.addf("mount the socket directory read-write (the exporter creates the socket) with subPath %q, got %+v", wantSub, mnt)
	}
	checkHostPath(p, "the socket directory", vol, SocketDir, corev1.HostPathDirectoryOrCreate)
	return vol.Name, true
}

func checkResources(p *problems, c *corev1.Container, want corev1.ResourceRequirements) {
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
		p.addf("container %s: resources %v, want %v", c.Name, c.Resources, want)
	}
}

func checkCSIContainers(p *problems, ds *appsv1.DaemonSet, want DaemonSetWant, socketVolume string) {
	spec := &ds.Spec.Template.Spec
	exporter, err := Exporter(ds)
	if err != nil {
		p.add(err)
		return
	}
	// csi-node: a native sidecar, started (and probed) before the exporter.
	if got := names(spec.InitContainers); !slices.Equal(got, []string{CSIContainer}) {
		p.addf("init containers %v, want [%s]", got, CSIContainer)
		return
	}
	node := &spec.InitContainers[0]
	if node.RestartPolicy == nil || *node.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		p.addf("%s must be a native sidecar (restartPolicy: Always)", CSIContainer)
	}
	if node.Image != exporter.Image {
		p.addf("%s runs image %s, the exporter %s: both binaries are in one image", CSIContainer, node.Image, exporter.Image)
	}
	if !slices.Equal(node.Command, []string{"/usr/local/bin/gpumem-csi"}) {
		p.addf("%s command %q, want /usr/local/bin/gpumem-csi", CSIContainer, node.Command)
	}
	if wantArgs := CSIArgs(want.driver(), path.Join(want.kubeletDir(), "pods")); !slices.Equal(node.Args, wantArgs) {
		p.addf("%s args %q, want %q", CSIContainer, node.Args, wantArgs)
	}
	checkNodeName(p, node)
	// The startup probe is what holds the exporter back until the
	// directory is its own.
	checkHTTPProbe(p, node, "startup", node.StartupProbe, "/-/healthy", CSIHealthPort, "")
	checkHTTPProbe(p, node, "liveness", node.LivenessProbe, "/-/healthy", CSIHealthPort, "")
	if sc := node.SecurityContext; sc == nil || !isTrue(sc.Privileged) || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		p.addf("%s must be privileged and run as uid 0 (bind mounts into pods, chown), got %+v", CSIContainer, sc)
	}
	if node.Resources.Requests.Memory().IsZero() || node.Resources.Limits.Memory().IsZero() {
		p.addf("%s: set a memory request and limit", CSIContainer)
	}

	mnt, vol, ok := mountAt(p, spec, node, SocketDir)
	if !ok {
		return
	}
	if vol.Name != socketVolume || mnt.ReadOnly {
		p.addf("%s must mount the exporter's socket directory (volume %s) read-write at %s, got volume %s readOnly %v", CSIContainer, socketVolume, SocketDir, vol.Name, mnt.ReadOnly)
	}
	_, pluginVol, ok := mountAt(p, spec, node, "/csi")
	if !ok {
		return
	}
	checkHostPath(p, "the CSI plugin directory", pluginVol, want.PluginDir(), corev1.HostPathDirectoryOrCreate)
	podsDir := path.Join(want.kubeletDir(), "pods")
	if mnt, vol, ok = mountAt(p, spec, node, podsDir); !ok {
		return
	}
	checkHostPath(p, "the kubelet's pods directory", vol, podsDir, corev1.HostPathDirectory)
	if mnt.MountPropagation == nil || *mnt.MountPropagation != corev1.MountPropagationBidirectional {
		p.addf("%s: mount %s with mountPropagation Bidirectional, so that its bind mounts reach the kubelet", CSIContainer, podsDir)
	}

	// The registrar, an ordinary container beside the exporter.
	if got := names(spec.Containers); !slices.Equal(got, []string{ExporterContainer, RegistrarContainer}) {
		p.addf("containers %v, want [%s %s]", got, ExporterContainer, RegistrarContainer)
		return
	}
	reg := &spec.Containers[1]
	image, tag, _ := strings.Cut(reg.Image, ":")
	if want.RegistrarImage != "" {
		if reg.Image != want.RegistrarImage {
			p.addf("%s image %s, want %s", RegistrarContainer, reg.Image, want.RegistrarImage)
		}
	} else if image != RegistrarImage || !strings.HasPrefix(tag, "v2.") {
		p.addf("%s image %s, want %s pinned to a v2 tag", RegistrarContainer, reg.Image, RegistrarImage)
	}
	for _, a := range []string{"--csi-address=/csi/csi.sock", "--kubelet-registration-path=" + want.PluginDir() + "/csi.sock"} {
		if !slices.Contains(reg.Args, a) {
			p.addf("%s args %q lack %s", RegistrarContainer, reg.Args, a)
		}
	}
	checkUnprivileged(p, reg, spec.SecurityContext)
	_, regPluginVol, ok := mountAt(p, spec, reg, "/csi")
	if !ok {
		return
	}
	if regPluginVol.Name != pluginVol.Name {
		p.addf("%s mounts volume %s at /csi, %s mounts %s: they must share the plugin's socket", RegistrarContainer, regPluginVol.Name, CSIContainer, pluginVol.Name)
	}
	if _, regVol, ok := mountAt(p, spec, reg, "/registration"); ok {
		checkHostPath(p, "the kubelet's plugin registry", regVol, path.Join(want.kubeletDir(), "plugins_registry"), corev1.HostPathDirectory)
	}
}
