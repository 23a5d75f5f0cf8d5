package kubernetes

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor that
// the manifests use. It is decoded strictly, like the typed objects, so that
// a misspelt field (which the API server would silently prune) fails here;
// a real field not listed yet must be added.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		JobLabel  string `json:"jobLabel,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			HonorLabels   bool   `json:"honorLabels,omitempty"`
			Relabelings   []struct {
				SourceLabels []string `json:"sourceLabels,omitempty"`
				Separator    string   `json:"separator,omitempty"`
				TargetLabel  string   `json:"targetLabel,omitempty"`
				Regex        string   `json:"regex,omitempty"`
				Replacement  string   `json:"replacement,omitempty"`
				Action       string   `json:"action,omitempty"`
			} `json:"relabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// object is one YAML document of one manifest file.
type object struct {
	file string
	kind string
	obj  any
}

// newObject returns what a document of apiVersion and kind decodes into.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1 Service":
		return &corev1.Service{}
	case "v1 Pod":
		return &corev1.Pod{}
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}
	case "batch/v1 Job":
		return &batchv1.Job{}
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &serviceMonitor{}
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		// No Go type here; kustomize has many fields. Checked as a map.
		return &map[string]any{}
	}
	return nil
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// loadManifests decodes every document of every YAML file in this
// directory, strictly (unknown or duplicate fields fail).
func loadManifests(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("*.yml")
	files = append(files, more...)
	if len(files) == 0 {
		t.Fatal("no YAML files found")
	}
	var objs []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSeparator.Split(string(data), -1) {
			if isEmptyDoc(doc) {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Errorf("%s, document %d: %v", f, i+1, err)
				continue
			}
			obj := newObject(tm.APIVersion, tm.Kind)
			if obj == nil {
				t.Errorf("%s, document %d: unexpected apiVersion %q kind %q (add it to newObject)", f, i+1, tm.APIVersion, tm.Kind)
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s, document %d (%s): %v", f, i+1, tm.Kind, err)
				continue
			}
			objs = append(objs, object{file: f, kind: tm.Kind, obj: obj})
		}
	}
	return objs
}

func isEmptyDoc(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

// manifests are the decoded objects, one of each kind the checks need.
type manifests struct {
	all            []object
	namespace      *corev1.Namespace
	serviceAccount *corev1.ServiceAccount
	clusterRole    *rbacv1.ClusterRole
	binding        *rbacv1.ClusterRoleBinding
	daemonSet      *appsv1.DaemonSet
	service        *corev1.Service
	serviceMonitor *serviceMonitor
	kustomization  map[string]any
	example        *batchv1.Job
}

func load(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{all: loadManifests(t)}
	one := func(kind string, dst any) {
		t.Helper()
		var found []object
		for _, o := range m.all {
			if o.kind == kind && o.file != "example-workload.yaml" {
				found = append(found, o)
			}
		}
		if len(found) != 1 {
			t.Fatalf("want exactly one %s among the deployed manifests, found %d", kind, len(found))
		}
		switch d := dst.(type) {
		case **corev1.Namespace:
			*d = found[0].obj.(*corev1.Namespace)
		case **corev1.ServiceAccount:
			*d = found[0].obj.(*corev1.ServiceAccount)
		case **rbacv1.ClusterRole:
			*d = found[0].obj.(*rbacv1.ClusterRole)
		case **rbacv1.ClusterRoleBinding:
			*d = found[0].obj.(*rbacv1.ClusterRoleBinding)
		case **appsv1.DaemonSet:
			*d = found[0].obj.(*appsv1.DaemonSet)
		case **corev1.Service:
			*d = found[0].obj.(*corev1.Service)
		case **serviceMonitor:
			*d = found[0].obj.(*serviceMonitor)
		case *map[string]any:
			*d = *found[0].obj.(*map[string]any)
		default:
			t.Fatalf("unhandled %T", dst)
		}
	}
	one("Namespace", &m.namespace)
	one("ServiceAccount", &m.serviceAccount)
	one("ClusterRole", &m.clusterRole)
	one("ClusterRoleBinding", &m.binding)
	one("DaemonSet", &m.daemonSet)
	one("Service", &m.service)
	one("ServiceMonitor", &m.serviceMonitor)
	one("Kustomization", &m.kustomization)
	for _, o := range m.all {
		if o.file == "example-workload.yaml" {
			if j, ok := o.obj.(*batchv1.Job); ok {
				m.example = j
			}
		}
	}
	if m.example == nil {
		t.Fatal("example-workload.yaml holds no Job")
	}
	return m
}

// exporter returns the DaemonSet's exporter container.
func (m *manifests) exporter(t *testing.T) *corev1.Container {
	t.Helper()
	cs := m.daemonSet.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("the DaemonSet has %d containers, want 1", len(cs))
	}
	return &cs[0]
}

// args returns the container's --flag=value arguments by flag name.
func args(t *testing.T, c *corev1.Container) map[string]string {
	t.Helper()
	if len(c.Command) != 0 {
		t.Errorf("container %s overrides the image's entrypoint: %q", c.Name, c.Command)
	}
	out := map[string]string{}
	for _, a := range c.Args {
		if !strings.HasPrefix(a, "--") {
			t.Errorf("argument %q: write flags as --name=value", a)
			continue
		}
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, dup := out[name]; dup {
			t.Errorf("flag --%s given twice", name)
		}
		out[name] = value
	}
	return out
}

func volume(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	t.Fatalf("no volume %q", name)
	return nil
}

// mountAt returns the mount at path and its volume.
func mountAt(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, mountPath string) (*corev1.VolumeMount, *corev1.Volume) {
	t.Helper()
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == mountPath {
			return &c.VolumeMounts[i], volume(t, spec, c.VolumeMounts[i].Name)
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, mountPath)
	return nil, nil
}

func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func TestManifestsDecodeStrictly(t *testing.T) {
	m := load(t)
	for _, o := range m.all {
		if o.kind == "Kustomization" || o.file == "example-workload.yaml" {
			continue
		}
		meta := o.obj.(metav1.Object)
		if meta.GetName() == "" {
			t.Errorf("%s: a %s without a name", o.file, o.kind)
		}
		if meta.GetLabels()["app.kubernetes.io/part-of"] != "gpumem" {
			t.Errorf("%s: %s %s lacks the label app.kubernetes.io/part-of=gpumem", o.file, o.kind, meta.GetName())
		}
	}
}

func TestNamespaces(t *testing.T) {
	m := load(t)
	ns := m.namespace.Name
	if ns != "gpumem" {
		t.Errorf("namespace %q, want gpumem", ns)
	}
	// hostPID and hostPath volumes need the privileged Pod Security level.
	if got := m.namespace.Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
		t.Errorf("namespace: pod-security.kubernetes.io/enforce=%q, want privileged (hostPID, hostPath)", got)
	}
	for _, o := range m.all {
		if o.file == "example-workload.yaml" {
			continue
		}
		meta, ok := o.obj.(metav1.Object)
		if !ok {
			continue
		}
		switch o.kind {
		case "Namespace", "ClusterRole", "ClusterRoleBinding":
			if meta.GetNamespace() != "" {
				t.Errorf("%s: cluster-scoped %s has namespace %q", o.file, o.kind, meta.GetNamespace())
			}
		default:
			if meta.GetNamespace() != ns {
				t.Errorf("%s: %s %s is in namespace %q, want %q", o.file, o.kind, meta.GetName(), meta.GetNamespace(), ns)
			}
		}
	}
}

func TestDaemonSetHostAccess(t *testing.T) {
	m := load(t)
	spec := &m.daemonSet.Spec.Template.Spec
	c := m.exporter(t)
	a := args(t, c)

	if !spec.HostPID {
		t.Error("hostPID must be true: NVML and SO_PEERCRED give host pids")
	}
	if spec.HostNetwork || spec.HostIPC {
		t.Error("hostNetwork and hostIPC are not needed")
	}

	// The host's /proc, read-only, where --path.procfs says.
	procfs, ok := a["path.procfs"]
	if !ok {
		t.Fatal("--path.procfs is not set")
	}
	if procfs != "/host/proc" {
		t.Errorf("--path.procfs=%s, want /host/proc", procfs)
	}
	mnt, vol := mountAt(t, spec, c, procfs)
	if !mnt.ReadOnly {
		t.Errorf("%s must be mounted read-only", procfs)
	}
	if vol.HostPath == nil || vol.HostPath.Path != "/proc" {
		t.Errorf("the volume at %s must be the host's /proc, got %+v", procfs, vol.VolumeSource)
	}

	// The socket's directory is the hostPath shared with workloads.
	sock, ok := a["allocstats.socket"]
	if !ok {
		t.Fatal("--allocstats.socket is not set: an explicit path makes a misconfigured directory a startup error")
	}
	if sock != "/run/gpumem/allocstats.sock" {
		t.Errorf("--allocstats.socket=%s, want the clients' default /run/gpumem/allocstats.sock", sock)
	}
	mnt, vol = mountAt(t, spec, c, path.Dir(sock))
	if mnt.ReadOnly {
		t.Error("the socket directory must be writable: the exporter creates the socket there")
	}
	if mnt.SubPath != "" {
		t.Error("mount the socket directory whole, without subPath")
	}
	if vol.HostPath == nil {
		t.Fatalf("the socket directory must be a hostPath volume, got %+v", vol.VolumeSource)
	}
	if vol.HostPath.Path != "/run/gpumem" {
		t.Errorf("socket hostPath %s, want /run/gpumem", vol.HostPath.Path)
	}
	if vol.HostPath.Type == nil || *vol.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("socket hostPath type %v, want DirectoryOrCreate", vol.HostPath.Type)
	}

	// NODE_NAME from the downward API.
	e := env(c, "NODE_NAME")
	if e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME must come from fieldRef spec.nodeName, got %+v", e)
	}
	if _, ok := a["kubernetes.node-name"]; ok {
		t.Error("leave --kubernetes.node-name to its NODE_NAME default")
	}

	// NVML through the NVIDIA container toolkit, not through the device plugin.
	if e := env(c, "NVIDIA_VISIBLE_DEVICES"); e == nil || e.Value != "all" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES must be all, got %+v", e)
	}
	if e := env(c, "NVIDIA_DRIVER_CAPABILITIES"); e == nil || !slices.Contains(strings.Split(e.Value, ","), "utility") {
		t.Errorf("NVIDIA_DRIVER_CAPABILITIES must include utility, got %+v", e)
	}
	for _, ctr := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, rl := range []corev1.ResourceList{ctr.Resources.Requests, ctr.Resources.Limits} {
			for name := range rl {
				if strings.HasPrefix(string(name), "nvidia.com/") {
					t.Errorf("container %s requests %s: the exporter would take a GPU from the workloads", ctr.Name, name)
				}
			}
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
}

func TestDaemonSetSecurity(t *testing.T) {
	m := load(t)
	spec := &m.daemonSet.Spec.Template.Spec
	c := m.exporter(t)
	if len(spec.InitContainers) != 0 {
		t.Errorf("unexpected init containers: %d", len(spec.InitContainers))
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the exporter container has no securityContext")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("the exporter must not be privileged")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem must be true")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities must drop ALL and add none, got %+v", sc.Capabilities)
	}
	// Root (for the root-owned hostPath socket directory), set explicitly:
	// the image's own user is nonroot.
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != 0 {
		t.Error("the pod must set runAsUser: 0 (the hostPath socket directory is root-owned)")
	}
	if sc.RunAsUser != nil && *sc.RunAsUser != 0 {
		t.Errorf("the container overrides runAsUser with %d", *sc.RunAsUser)
	}
	if spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken {
		t.Error("the service account token is needed to watch pods")
	}
	if spec.ServiceAccountName != m.serviceAccount.Name {
		t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, m.serviceAccount.Name)
	}
	if c.Image == "" || strings.HasSuffix(c.Image, ":latest") || !strings.Contains(path.Base(c.Image), ":") {
		t.Errorf("image %q: pin a tag", c.Image)
	}
}

func TestDaemonSetProbesResourcesRollout(t *testing.T) {
	m := load(t)
	ds := m.daemonSet
	c := m.exporter(t)
	a := args(t, c)

	port := containerPort(t, c, "metrics")
	listen, ok := a["web.listen-address"]
	if !ok {
		t.Fatal("--web.listen-address is not set")
	}
	if _, p, _ := strings.Cut(listen, ":"); p != strconv.Itoa(int(port)) {
		t.Errorf("--web.listen-address=%s but the metrics container port is %d", listen, port)
	}

	for name, tc := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{
		"readiness": {c.ReadinessProbe, "/-/ready"},
		"liveness":  {c.LivenessProbe, "/-/healthy"},
	} {
		if tc.probe == nil || tc.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", name)
			continue
		}
		g := tc.probe.HTTPGet
		if g.Path != tc.path {
			t.Errorf("%s probe path %s, want %s", name, g.Path, tc.path)
		}
		if g.Port != intstr.FromString("metrics") && g.Port != intstr.FromInt32(port) {
			t.Errorf("%s probe port %s, want metrics", name, g.Port.String())
		}
	}

	req := c.Resources.Requests
	if req.Cpu().IsZero() || req.Memory().IsZero() {
		t.Error("set CPU and memory requests")
	}
	if c.Resources.Limits.Memory().IsZero() {
		t.Error("set a memory limit")
	}

	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		t.Errorf("update strategy %s, want RollingUpdate", ds.Spec.UpdateStrategy.Type)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxSurge != nil && ru.MaxSurge.String() != "0" && ru.MaxSurge.String() != "0%" {
		t.Errorf("maxSurge %s: two exporters cannot share a node's socket", ru.MaxSurge.String())
	}
	if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g < 6 {
		t.Error("terminationGracePeriodSeconds must cover the exporter's 5 s HTTP shutdown")
	}
}

func containerPort(t *testing.T, c *corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %s", c.Name, name)
	return 0
}

func TestRBAC(t *testing.T) {
	m := load(t)
	rules := m.clusterRole.Rules
	if len(rules) != 1 {
		t.Fatalf("ClusterRole has %d rules, want 1 (pods only)", len(rules))
	}
	r := rules[0]
	sorted := func(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }
	if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.Resources, []string{"pods"}) ||
		!slices.Equal(sorted(r.Verbs), []string{"get", "list", "watch"}) ||
		len(r.ResourceNames) != 0 || len(r.NonResourceURLs) != 0 {
		t.Errorf("ClusterRole rule %+v, want exactly get, list, watch on core pods", r)
	}
	if m.clusterRole.AggregationRule != nil {
		t.Error("the ClusterRole must not aggregate other roles")
	}

	b := m.binding
	if b.RoleRef.APIGroup != rbacv1.GroupName || b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != m.clusterRole.Name {
		t.Errorf("ClusterRoleBinding roleRef %+v, want ClusterRole %s", b.RoleRef, m.clusterRole.Name)
	}
	want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: m.daemonSet.Spec.Template.Spec.ServiceAccountName, Namespace: m.daemonSet.Namespace}
	if len(b.Subjects) != 1 || b.Subjects[0] != want {
		t.Errorf("ClusterRoleBinding subjects %+v, want [%+v]", b.Subjects, want)
	}
	if m.serviceAccount.Name != want.Name || m.serviceAccount.Namespace != want.Namespace {
		t.Errorf("ServiceAccount %s/%s, but the binding names %s/%s", m.serviceAccount.Namespace, m.serviceAccount.Name, want.Namespace, want.Name)
	}
}

// selects reports whether every key=value of selector is in labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestServiceAndServiceMonitor(t *testing.T) {
	m := load(t)
	ds, svc, sm := m.daemonSet, m.service, m.serviceMonitor
	podLabels := ds.Spec.Template.Labels

	if ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchExpressions) != 0 || !selects(ds.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("the DaemonSet's selector %+v does not select its own pod template %v", ds.Spec.Selector, podLabels)
	}
	if !selects(svc.Spec.Selector, podLabels) {
		t.Errorf("the Service's selector %v does not select the DaemonSet's pods %v", svc.Spec.Selector, podLabels)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("the Service must be headless, clusterIP %q", svc.Spec.ClusterIP)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Error("publishNotReadyAddresses must be true: an exporter whose NVML is down must still be scraped")
	}
	port := containerPort(t, m.exporter(t), "metrics")
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("the Service has %d ports, want 1", len(svc.Spec.Ports))
	}
	sp := svc.Spec.Ports[0]
	if sp.Name != "metrics" || sp.Port != port ||
		(sp.TargetPort != intstr.FromString("metrics") && sp.TargetPort != intstr.FromInt32(port)) {
		t.Errorf("Service port %+v, want metrics %d to the container's metrics port", sp, port)
	}

	if sm.Namespace != svc.Namespace && (sm.Spec.NamespaceSelector == nil || !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace)) {
		t.Errorf("the ServiceMonitor in %s does not look in the Service's namespace %s", sm.Namespace, svc.Namespace)
	}
	if len(sm.Spec.Selector.MatchExpressions) != 0 || !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
		t.Errorf("the ServiceMonitor's selector %+v does not select the Service's labels %v", sm.Spec.Selector, svc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("the ServiceMonitor has %d endpoints, want 1", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != sp.Name {
		t.Errorf("the ServiceMonitor scrapes port %q, the Service's is %q", ep.Port, sp.Name)
	}
	if !ep.HonorLabels {
		t.Error("honorLabels must be true: the workload's namespace and pod labels must win over the target's")
	}
	if ep.Path != "" && ep.Path != "/metrics" {
		t.Errorf("scrape path %s, the exporter serves /metrics", ep.Path)
	}
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	m := load(t)
	k := m.kustomization
	if k["apiVersion"] != "kustomize.config.k8s.io/v1beta1" || k["kind"] != "Kustomization" {
		t.Errorf("kustomization.yaml: apiVersion %v kind %v", k["apiVersion"], k["kind"])
	}
	raw, _ := k["resources"].([]any)
	var listed []string
	for _, r := range raw {
		s, ok := r.(string)
		if !ok {
			t.Errorf("kustomization.yaml: resource %v is not a string", r)
			continue
		}
		listed = append(listed, s)
	}
	var want []string
	files, _ := filepath.Glob("*.y*ml")
	for _, f := range files {
		if f == "kustomization.yaml" || strings.HasPrefix(f, "example") {
			continue
		}
		want = append(want, f)
	}
	sort.Strings(listed)
	sort.Strings(want)
	if !slices.Equal(listed, want) {
		t.Errorf("kustomization.yaml lists %v, want every manifest but the examples: %v", listed, want)
	}
}

// definedFlags returns the flags the exporter binary defines, read from its
// sources: Flag("name" calls in the main package and the collector package,
// a --collector.<name> per registerCollector("name", and the flags that
// exporter-toolkit's kingpinflag.AddFlags adds (asked from the package).
func definedFlags(t *testing.T) map[string]bool {
	t.Helper()
	var sources []string
	for _, pattern := range []string{"../../*.go", "../../collector/*.go"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				sources = append(sources, f)
			}
		}
	}
	flagCall := regexp.MustCompile(`\bFlag\("([a-z0-9.\-]+)"`)
	collectorCall := regexp.MustCompile(`\bregisterCollector\("([a-z0-9_\-]+)"`)
	flags := map[string]bool{}
	toolkit := false
	for _, f := range sources {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagCall.FindAllSubmatch(src, -1) {
			flags[string(m[1])] = true
		}
		for _, m := range collectorCall.FindAllSubmatch(src, -1) {
			flags["collector."+string(m[1])] = true
		}
		toolkit = toolkit || bytes.Contains(src, []byte("kingpinflag.AddFlags("))
	}
	if toolkit {
		app := kingpin.New("gpumem_exporter", "")
		kingpinflag.AddFlags(app, ":9481")
		for _, f := range app.Model().Flags {
			flags[f.Name] = true
		}
	}
	if !flags["path.procfs"] || !flags["allocstats.socket"] || !flags["web.listen-address"] {
		t.Fatalf("reading the flags from the sources failed (found %d): did main.go move?", len(flags))
	}
	return flags
}

func TestDaemonSetFlagsExist(t *testing.T) {
	m := load(t)
	flags := definedFlags(t)
	for name := range args(t, m.exporter(t)) {
		if flags[name] || (strings.HasPrefix(name, "no-") && flags[strings.TrimPrefix(name, "no-")]) {
			continue
		}
		t.Errorf("--%s is not a flag of gpumem_exporter", name)
	}
}

func TestExampleWorkload(t *testing.T) {
	m := load(t)
	job := m.example
	spec := &job.Spec.Template.Spec
	if spec.HostPID {
		t.Error("workloads keep their own PID namespace: only the exporter needs hostPID")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("the example has %d containers, want 1", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if _, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok {
		t.Error("the example workload should ask for a GPU")
	}

	// GPUMEM_SOCKET, seen through the workload's mount, is the exporter's
	// socket on the host.
	sock := args(t, m.exporter(t))["allocstats.socket"]
	dsMount, dsVol := mountAt(t, &m.daemonSet.Spec.Template.Spec, m.exporter(t), path.Dir(sock))
	e := env(c, "GPUMEM_SOCKET")
	if e == nil || e.Value == "" {
		t.Fatal("the example must set GPUMEM_SOCKET")
	}
	mnt, vol := mountAt(t, spec, c, path.Dir(e.Value))
	if path.Base(e.Value) != path.Base(sock) {
		t.Errorf("GPUMEM_SOCKET=%s, but the exporter's socket is named %s", e.Value, path.Base(sock))
	}
	if vol.HostPath == nil || vol.HostPath.Path != dsVol.HostPath.Path {
		t.Errorf("the workload's volume %s at %s must be hostPath %s, as the exporter's at %s", vol.Name, mnt.MountPath, dsVol.HostPath.Path, dsMount.MountPath)
	}
	if mnt.SubPath != "" {
		t.Error("mount the socket directory, not the socket file: the exporter recreates the socket on restart")
	}

	// Zero-code mode: PYTHONPATH names the mounted client directories.
	if e := env(c, "PYTHONPATH"); e != nil {
		for _, dir := range strings.Split(e.Value, ":") {
			found := false
			for _, vm := range c.VolumeMounts {
				if vm.MountPath == dir || strings.HasPrefix(vm.MountPath, dir+"/") {
					found = true
				}
			}
			if !found {
				t.Errorf("PYTHONPATH entry %s is not a mounted directory", dir)
			}
		}
	}
}
