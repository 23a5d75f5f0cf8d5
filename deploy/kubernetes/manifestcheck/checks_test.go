package manifestcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// deployment is deploy/kubernetes as `kubectl apply -k` takes it, decoded.
type deployment struct {
	objs    []Object
	ds      *appsv1.DaemonSet
	role    *rbacv1.ClusterRole
	binding *rbacv1.ClusterRoleBinding
	sa      *corev1.ServiceAccount
	svc     *corev1.Service
	sm      *ServiceMonitor
	driver  *storagev1.CSIDriver
}

func load(t *testing.T) *deployment {
	t.Helper()
	data, err := Kustomize("..")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode("kustomize build", data)
	if err != nil {
		t.Fatal(err)
	}
	d := &deployment{objs: objs}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	d.ds, err = One[appsv1.DaemonSet](objs)
	must(err)
	d.role, err = One[rbacv1.ClusterRole](objs)
	must(err)
	d.binding, err = One[rbacv1.ClusterRoleBinding](objs)
	must(err)
	d.sa, err = One[corev1.ServiceAccount](objs)
	must(err)
	d.svc, err = One[corev1.Service](objs)
	must(err)
	d.sm, err = One[ServiceMonitor](objs)
	must(err)
	d.driver, err = One[storagev1.CSIDriver](objs)
	must(err)
	return d
}

// checks runs every check this test breaks, on d.
func (d *deployment) checks() error {
	var p problems
	for _, err := range []error{
		CheckDaemonSet(d.ds, DaemonSetWant{CSI: true}),
		CheckRBAC(d.role, d.binding, d.sa, d.ds),
		CheckService(d.ds, d.svc, d.sm, nil),
		CheckCSIDriver(d.driver, DefaultDriverName),
		CheckLabels(d.objs),
	} {
		p.add(err)
	}
	return p.err()
}

// Each break is one mistake a manifest could make; the checks must name
// it, and pass the deployment as it is.
func TestChecksFindWhatIsBroken(t *testing.T) {
	if err := load(t).checks(); err != nil {
		t.Fatalf("the deployment as it is: %v", err)
	}
	for _, tc := range []struct {
		name  string
		brk   func(d *deployment)
		wants string
	}{
		{"no host pid namespace", func(d *deployment) { d.ds.Spec.Template.Spec.HostPID = false }, "hostPID must be true"},
		{"host network", func(d *deployment) { d.ds.Spec.Template.Spec.HostNetwork = true }, "hostNetwork and hostIPC are not needed"},
		{"no toleration", func(d *deployment) { d.ds.Spec.Template.Spec.Tolerations = nil }, "nvidia.com/gpu"},
		{"the exporter asks for a GPU", func(d *deployment) {
			c := container(d.ds.Spec.Template.Spec.Containers, ExporterContainer)
			if c.Resources.Limits == nil {
				c.Resources.Limits = corev1.ResourceList{}
			}
			c.Resources.Limits["nvidia.com/gpu"] = c.Resources.Limits[corev1.ResourceMemory]
		}, "would take a GPU"},
		{"get on pods", func(d *deployment) { d.role.Rules[0].Verbs = append(d.role.Rules[0].Verbs, "get") }, "list and watch on core pods"},
		{"binding to another account", func(d *deployment) { d.binding.Subjects[0].Name = "default" }, "ClusterRoleBinding subjects"},
		{"a Service with a cluster IP", func(d *deployment) { d.svc.Spec.ClusterIP = "10.0.0.1" }, "must be headless"},
		{"not-ready exporters unscraped", func(d *deployment) { d.svc.Spec.PublishNotReadyAddresses = false }, "publishNotReadyAddresses"},
		{"the Service on another port", func(d *deployment) { d.svc.Spec.Ports[0].Port++ }, "want metrics"},
		{"no sample limit", func(d *deployment) { d.sm.Spec.SampleLimit = nil }, "sampleLimit"},
		{"target labels win", func(d *deployment) { d.sm.Spec.Endpoints[0].HonorLabels = false }, "honorLabels must be true"},
		{"another scrape path", func(d *deployment) { d.sm.Spec.Endpoints[0].Path = "/stats" }, "scrape path /stats"},
		{"a CSI driver that attaches", func(d *deployment) { t := true; d.driver.Spec.AttachRequired = &t }, "attachRequired must be false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := load(t)
			tc.brk(d)
			err := d.checks()
			if err == nil || !strings.Contains(err.Error(), tc.wants) {
				t.Errorf("checks = %v, want an error with %q", err, tc.wants)
			}
		})
	}
}

func TestSelectsNeedsEveryKeyAndSomeKey(t *testing.T) {
	labels := map[string]string{"app": "gpumem", "tier": "node"}
	for _, tc := range []struct {
		selector map[string]string
		want     bool
	}{
		{map[string]string{"app": "gpumem"}, true},
		{map[string]string{"app": "gpumem", "tier": "node"}, true},
		{map[string]string{"app": "gpumem", "tier": "web"}, false},
		{map[string]string{"other": "x"}, false},
		{nil, false}, // the deployment never means "all"
	} {
		if got := Selects(tc.selector, labels); got != tc.want {
			t.Errorf("Selects(%v) = %v, want %v", tc.selector, got, tc.want)
		}
	}
}

func TestSameFileComparesBytes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b, c := write("a", "x: 1\n"), write("b", "x: 1\n"), write("c", "x: 2\n")
	if same, err := SameFile(a, b); err != nil || !same {
		t.Errorf("SameFile(a, b) = %v, %v; want true", same, err)
	}
	if same, err := SameFile(a, c); err != nil || same {
		t.Errorf("SameFile(a, c) = %v, %v; want false", same, err)
	}
	missing := filepath.Join(dir, "missing")
	if same, err := SameFile(a, missing); err != nil || same {
		t.Errorf("SameFile(a, missing) = %v, %v; want false (a copy yet to be made)", same, err)
	}
	if _, err := SameFile(missing, a); err == nil {
		t.Error("SameFile(missing, a): no error for a missing source")
	}
}
