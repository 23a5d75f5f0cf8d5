package helm

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck"
	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck/manifestchecktest"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Run with -update after changing deploy/prometheus/rules.yml,
// fleet-rules.yml or dashboards/.
var update = flag.Bool("update", false, "copy deploy/prometheus/rules.yml, fleet-rules.yml and dashboards/*.json into the chart's files/")

const (
	chartDir      = "gpumem-exporter"
	rulesSource   = "../prometheus/rules.yml"
	fleetSource   = "../prometheus/fleet-rules.yml"
	dashboardsDir = "../../dashboards"
	kustomizeDir  = "../kubernetes"
	// The kustomization's namespace and names: a release named like the
	// chart, in that namespace, renders the same names.
	namespace   = "gpumem"
	releaseName = "gpumem-exporter"
)

// kubeVersion is the cluster the chart is rendered for: a recent one.
var kubeVersion = chartutil.KubeVersion{Version: "v1.34.0", Major: "1", Minor: "34"}

// copies are the files the chart carries from outside its directory (Helm
// reads no file outside the chart): source to copy.
func copies(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{
		rulesSource: filepath.Join(chartDir, "files", "rules.yml"),
		fleetSource: filepath.Join(chartDir, "files", "fleet-rules.yml"),
	}
	dashboards, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil || len(dashboards) == 0 {
		t.Fatalf("no dashboards in %s (%v)", dashboardsDir, err)
	}
	for _, d := range dashboards {
		m[d] = filepath.Join(chartDir, "files", "dashboards", filepath.Base(d))
	}
	return m
}

// TestChartCopiesAreCurrent keeps files/ identical to its sources. It runs
// first, so that -update refreshes the copies before the chart is rendered.
func TestChartCopiesAreCurrent(t *testing.T) {
	want := copies(t)
	if *update {
		stale, _ := filepath.Glob(filepath.Join(chartDir, "files", "dashboards", "*.json"))
		for _, f := range stale {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		for src, dst := range want {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for src, dst := range want {
		same, err := manifestcheck.SameFile(src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if !same {
			t.Errorf("%s is not a copy of %s: run go -C deploy test ./helm -run TestChartCopiesAreCurrent -update", dst, src)
		}
	}
	copied := map[string]bool{}
	for _, dst := range want {
		copied[dst] = true
	}
	have, _ := filepath.Glob(filepath.Join(chartDir, "files", "dashboards", "*"))
	for _, f := range have {
		if !copied[f] {
			t.Errorf("%s has no source in %s: run go -C deploy test ./helm -run TestChartCopiesAreCurrent -update", f, dashboardsDir)
		}
	}
}

func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	if file == "" {
		return map[string]any{}
	}
	v, err := chartutil.ReadValuesFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// render renders the chart as `helm template` does and decodes every
// document strictly. It returns the objects and NOTES.txt.
func render(t *testing.T, valuesFile, release, ns string, kv chartutil.KubeVersion) ([]manifestcheck.Object, string, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kv
	vals, err := chartutil.ToRenderValues(chrt, readValues(t, valuesFile),
		chartutil.ReleaseOptions{Name: release, Namespace: ns, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		t.Fatalf("values %s: %v", valuesFile, err)
	}
	out, err := engine.Render(chrt, vals)
	if err != nil {
		return nil, "", err
	}
	var names []string
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []manifestcheck.Object
	var notes string
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			notes = out[name]
			continue
		}
		got, err := manifestcheck.Decode(name, []byte(out[name]))
		if err != nil {
			t.Errorf("values %s: %v", valuesFile, err)
		}
		objs = append(objs, got...)
	}
	return objs, notes, nil
}

func mustRender(t *testing.T, valuesFile, release, ns string) ([]manifestcheck.Object, string) {
	t.Helper()
	objs, notes, err := render(t, valuesFile, release, ns, kubeVersion)
	if err != nil {
		t.Fatalf("rendering with values %q: %v", valuesFile, err)
	}
	return objs, notes
}

func TestLint(t *testing.T) {
	for _, values := range []string{"", "csi-off.yaml", "networkpolicy-default.yaml", "networkpolicy.yaml", "custom.yaml", "no-monitoring.yaml", "fleet.yaml", "alerting.yaml", "runbook.yaml"} {
		t.Run(strings.TrimSuffix(cmpOr(values, "defaults"), ".yaml"), func(t *testing.T) {
			kv := kubeVersion
			l := lint.AllWithKubeVersion(chartDir, readValues(t, values), namespace, &kv)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m.Error())
				} else {
					t.Logf("helm lint: %s", m.Error())
				}
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// renderCase is one values file and what its rendering must hold.
type renderCase struct {
	values      string
	release, ns string
	ds          manifestcheck.DaemonSetWant
	monitoring  bool              // ServiceMonitor, PrometheusRule, dashboards
	fleet       bool              // the PrometheusRule of fleet-rules.yml too
	promLabels  map[string]string // on the ServiceMonitor and PrometheusRule
	dashboardNS string
	netpol      *networkingv1.NetworkPolicyPeer
	alerting    bool // the AlertmanagerConfig
}

func renderCases() []renderCase {
	defaults := manifestcheck.DaemonSetWant{CSI: true, Image: "ghcr.io/gpumem/gpumem_exporter:0.1.0"}
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
	}
	noCSI := defaults
	noCSI.CSI = false
	eventsOff := defaults
	eventsOff.ExtraArgs = []string{manifestcheck.NoOOMEventsFlag}
	return []renderCase{
		{values: "", release: releaseName, ns: namespace, ds: defaults, monitoring: true, dashboardNS: namespace},
		{values: "csi-off.yaml", release: releaseName, ns: namespace, ds: noCSI, monitoring: true, dashboardNS: namespace},
		{values: "no-monitoring.yaml", release: releaseName, ns: namespace, ds: defaults},
		{values: "fleet.yaml", release: releaseName, ns: namespace, ds: defaults, monitoring: true, fleet: true, dashboardNS: namespace},
		{values: "events-off.yaml", release: releaseName, ns: namespace, ds: eventsOff, monitoring: true, dashboardNS: namespace},
		{values: "alerting.yaml", release: releaseName, ns: namespace, ds: defaults, monitoring: true, dashboardNS: namespace, alerting: true},
		{
			// The documented default peer: Prometheus pods in any namespace.
			values: "networkpolicy-default.yaml", release: releaseName, ns: namespace, ds: defaults, monitoring: true, dashboardNS: namespace,
			netpol: &networkingv1.NetworkPolicyPeer{
				NamespaceSelector: &metav1.LabelSelector{},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "prometheus"}},
			},
		},
		{
			values: "networkpolicy.yaml", release: releaseName, ns: namespace, ds: defaults, monitoring: true, dashboardNS: namespace,
			netpol: &networkingv1.NetworkPolicyPeer{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "prometheus"}},
			},
		},
		{
			values: "custom.yaml", release: "gpu", ns: "observability",
			ds: manifestcheck.DaemonSetWant{
				CSI:               true,
				Image:             "registry.example.com/gpu/gpumem_exporter:1.2.3",
				RegistrarImage:    "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.15.0",
				DriverName:        "gpumem.example.com",
				KubeletDir:        "/var/lib/k0s/kubelet",
				PriorityClassName: "gpu-monitoring",
				Resources:         &res,
				ExtraArgs:         []string{"--log.level=debug"},
			},
			monitoring:  true,
			promLabels:  map[string]string{"release": "kube-prometheus-stack", "team": "gpu"},
			dashboardNS: "monitoring",
		},
	}
}

func TestRenderedObjectsKeepTheContract(t *testing.T) {
	for _, tc := range renderCases() {
		t.Run(strings.TrimSuffix(cmpOr(tc.values, "defaults"), ".yaml"), func(t *testing.T) {
			objs, notes := mustRender(t, tc.values, tc.release, tc.ns)
			if strings.TrimSpace(notes) == "" {
				t.Error("NOTES.txt renders empty")
			}
			manifestchecktest.Report(t, manifestcheck.CheckLabels(objs))
			manifestchecktest.Report(t, manifestcheck.CheckNamespaces(objs, tc.ns, tc.dashboardNS))
			manifestchecktest.Report(t, manifestcheck.None[corev1.Namespace](objs)) // helm install --create-namespace; labels documented

			ds := manifestchecktest.One[appsv1.DaemonSet](t, objs)
			manifestchecktest.Report(t, manifestcheck.CheckDaemonSet(ds, tc.ds))
			manifestchecktest.Report(t, manifestcheck.CheckRBAC(manifestchecktest.One[rbacv1.ClusterRole](t, objs), manifestchecktest.One[rbacv1.ClusterRoleBinding](t, objs),
				manifestchecktest.One[corev1.ServiceAccount](t, objs), ds))

			svc := manifestchecktest.One[corev1.Service](t, objs)
			if tc.monitoring {
				manifestchecktest.Report(t, manifestcheck.CheckService(ds, svc, manifestchecktest.One[manifestcheck.ServiceMonitor](t, objs), tc.promLabels))
				rules, fleet, err := manifestcheck.Rules(objs)
				if err != nil {
					t.Fatal(err)
				}
				if rules == nil {
					t.Fatal("no PrometheusRule of rules.yml")
				}
				manifestchecktest.Report(t, manifestcheck.CheckPrometheusRule(rules, rulesSource, tc.promLabels))
				switch {
				case tc.fleet && fleet == nil:
					t.Error("prometheusRule.fleet: no PrometheusRule of fleet-rules.yml")
				case tc.fleet:
					manifestchecktest.Report(t, manifestcheck.CheckPrometheusRule(fleet, fleetSource, tc.promLabels))
					if fleet.Name == rules.Name {
						t.Errorf("both PrometheusRules are named %s", fleet.Name)
					}
				case fleet != nil:
					t.Errorf("PrometheusRule %s of fleet-rules.yml without prometheusRule.fleet", fleet.Name)
				}
				manifestchecktest.Report(t, manifestcheck.CheckDashboards(manifestcheck.All[corev1.ConfigMap](objs), dashboardsDir, "grafana_dashboard", "1"))
				for _, cm := range manifestcheck.All[corev1.ConfigMap](objs) {
					if tc.values == "custom.yaml" && cm.Annotations["grafana_folder"] != "GPU" {
						t.Errorf("dashboard ConfigMap %s lacks the annotation grafana_folder=GPU", cm.Name)
					}
				}
			} else {
				manifestchecktest.Report(t, manifestcheck.CheckService(ds, svc, nil, nil))
				manifestchecktest.Report(t, manifestcheck.None[manifestcheck.ServiceMonitor](objs))
				manifestchecktest.Report(t, manifestcheck.None[manifestcheck.PrometheusRule](objs))
				manifestchecktest.Report(t, manifestcheck.None[corev1.ConfigMap](objs))
			}

			if tc.ds.CSI {
				driver := cmpOr(tc.ds.DriverName, manifestcheck.DefaultDriverName)
				manifestchecktest.Report(t, manifestcheck.CheckCSIDriver(manifestchecktest.One[storagev1.CSIDriver](t, objs), driver))
				if !strings.Contains(notes, "driver: "+driver) {
					t.Errorf("NOTES.txt does not show the CSI volume of driver %s:\n%s", driver, notes)
				}
			} else {
				manifestchecktest.Report(t, manifestcheck.None[storagev1.CSIDriver](objs))
			}

			if !tc.alerting {
				manifestchecktest.Report(t, manifestcheck.None[manifestcheck.AlertmanagerConfig](objs))
			}

			if tc.netpol != nil {
				manifestchecktest.Report(t, manifestcheck.CheckNetworkPolicy(manifestchecktest.One[networkingv1.NetworkPolicy](t, objs), ds, *tc.netpol))
			} else {
				manifestchecktest.Report(t, manifestcheck.None[networkingv1.NetworkPolicy](objs))
			}
		})
	}
}

// TestCSINeedsKubernetes129: csi-node is a native sidecar; an older API
// server would drop restartPolicy and wait forever for it to "finish".
func TestCSINeedsKubernetes129(t *testing.T) {
	old := chartutil.KubeVersion{Version: "v1.28.9", Major: "1", Minor: "28"}
	if _, _, err := render(t, "", releaseName, namespace, old); err == nil || !strings.Contains(err.Error(), "1.29") {
		t.Errorf("rendering with CSI for Kubernetes 1.28: error %v, want one that asks for 1.29", err)
	}
	// helm template without --kube-version renders for Helm's default
	// version: the error says how to give the cluster's.
	_, _, err := render(t, "", releaseName, namespace, chartutil.DefaultCapabilities.KubeVersion)
	for _, want := range []string{chartutil.DefaultCapabilities.KubeVersion.Version, "helm template", "--kube-version", "helm install", "csi.enabled=false"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rendering for Helm's default Kubernetes version: error %v, want one that says %q", err, want)
		}
	}
	if _, _, err := render(t, "csi-off.yaml", releaseName, namespace, old); err != nil {
		t.Errorf("rendering without CSI for Kubernetes 1.28: %v", err)
	}
	eks := chartutil.KubeVersion{Version: "v1.29.3-eks-adc7111", Major: "1", Minor: "29+"}
	if _, _, err := render(t, "", releaseName, namespace, eks); err != nil {
		t.Errorf("rendering for a 1.29 pre-release-style version: %v", err)
	}
}

// TestChartRendersWhatKustomizeBuilds: the chart's defaults, for a release
// named like the chart in namespace gpumem, give the same pod, RBAC rule,
// CSIDriver, Service ports and scrape as `kubectl apply -k deploy/kubernetes`.
func TestChartRendersWhatKustomizeBuilds(t *testing.T) {
	helmObjs, _ := mustRender(t, "", releaseName, namespace)
	kustomized, err := manifestcheck.Kustomize(kustomizeDir)
	if err != nil {
		t.Fatal(err)
	}
	kustObjs, err := manifestcheck.Decode("kustomize build", kustomized)
	if err != nil {
		t.Fatal(err)
	}
	same := func(what string, h, k any) {
		t.Helper()
		if !reflect.DeepEqual(h, k) {
			t.Errorf("%s differs between the chart and the kustomization: %s", what, firstDiff(h, k))
		}
	}
	hds, kds := manifestchecktest.One[appsv1.DaemonSet](t, helmObjs), manifestchecktest.One[appsv1.DaemonSet](t, kustObjs)
	hspec, kspec := hds.Spec.Template.Spec, kds.Spec.Template.Spec
	for i := range hspec.InitContainers {
		if i < len(kspec.InitContainers) {
			same("init container "+hspec.InitContainers[i].Name, hspec.InitContainers[i], kspec.InitContainers[i])
		}
	}
	for i := range hspec.Containers {
		if i < len(kspec.Containers) {
			same("container "+hspec.Containers[i].Name, hspec.Containers[i], kspec.Containers[i])
		}
	}
	same("pod spec", hspec, kspec)
	same("update strategy", hds.Spec.UpdateStrategy, kds.Spec.UpdateStrategy)
	same("ClusterRole rules", manifestchecktest.One[rbacv1.ClusterRole](t, helmObjs).Rules, manifestchecktest.One[rbacv1.ClusterRole](t, kustObjs).Rules)
	same("CSIDriver spec", manifestchecktest.One[storagev1.CSIDriver](t, helmObjs).Spec, manifestchecktest.One[storagev1.CSIDriver](t, kustObjs).Spec)
	same("Service ports", manifestchecktest.One[corev1.Service](t, helmObjs).Spec.Ports, manifestchecktest.One[corev1.Service](t, kustObjs).Spec.Ports)
	hsm, ksm := manifestchecktest.One[manifestcheck.ServiceMonitor](t, helmObjs), manifestchecktest.One[manifestcheck.ServiceMonitor](t, kustObjs)
	same("ServiceMonitor endpoints", hsm.Spec.Endpoints, ksm.Spec.Endpoints)
	same("ServiceMonitor sampleLimit", deref(hsm.Spec.SampleLimit), deref(ksm.Spec.SampleLimit))
	same("PrometheusRule groups", manifestchecktest.One[manifestcheck.PrometheusRule](t, helmObjs).Spec, manifestchecktest.One[manifestcheck.PrometheusRule](t, kustObjs).Spec)
	dashboards := func(objs []manifestcheck.Object) map[string]string {
		m := map[string]string{}
		for _, cm := range manifestcheck.All[corev1.ConfigMap](objs) {
			for k, v := range cm.Data {
				m[k] = v
			}
		}
		return m
	}
	same("dashboards", dashboards(helmObjs), dashboards(kustObjs))
}

// firstDiff shows where the YAML of two values first differs.
func firstDiff(helm, kustomize any) string {
	h, _ := yaml.Marshal(helm)
	k, _ := yaml.Marshal(kustomize)
	hl, kl := strings.Split(string(h), "\n"), strings.Split(string(k), "\n")
	for i := 0; i < len(hl) || i < len(kl); i++ {
		var a, b string
		if i < len(hl) {
			a = hl[i]
		}
		if i < len(kl) {
			b = kl[i]
		}
		if a != b {
			return fmt.Sprintf("line %d of its YAML:\n  helm:      %q\n  kustomize: %q", i+1, a, b)
		}
	}
	return "(same YAML)"
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// TestValuesSchemaRejectsMistakes: values.schema.json turns a misspelt key
// or a wrong type into an install error instead of a silently ignored value.
func TestValuesSchemaRejectsMistakes(t *testing.T) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range map[string]map[string]any{
		"misspelt key":      {"serviceMonitor": map[string]any{"sampleLimt": 5000}},
		"unknown top key":   {"csiEnabled": false},
		"wrong type":        {"csi": map[string]any{"enabled": "no"}},
		"relative hostPath": {"socketHostPath": "run/gpumem"},
		"bare extra arg":    {"exporter": map[string]any{"extraArgs": []any{"log.level=debug"}}},
		"pull policy":       {"image": map[string]any{"repository": "x", "pullPolicy": "Sometimes"}},
		"events not a bool": {"kubernetesEvents": map[string]any{"oom": "off"}},
		"runbook anchor":    {"prometheusRule": map[string]any{"runbookBaseURL": "https://wiki.example.com/alerts#gpu"}},
		"runbook path":      {"prometheusRule": map[string]any{"runbookBaseURL": "docs/alerts.md"}},
		"alerting interval": {"alertmanagerConfig": map[string]any{"groupWait": "30"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := chartutil.ToRenderValues(chrt, vals, chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true}, chartutil.DefaultCapabilities)
			if err == nil {
				t.Errorf("values %v accepted, want a schema error", vals)
			}
		})
	}
}
