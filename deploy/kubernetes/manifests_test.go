package kubernetes

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck"
	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck/manifestchecktest"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	psaapi "k8s.io/pod-security-admission/api"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "regenerate prometheusrule.yaml, grafana-dashboards.yaml and fleet-rules/prometheusrule.yaml")

const (
	namespace      = "gpumem"
	rulesSource    = "../prometheus/rules.yml"
	fleetSource    = "../prometheus/fleet-rules.yml"
	dashboardsDir  = "../../dashboards"
	rulesFile      = "prometheusrule.yaml"
	dashboardsFile = "grafana-dashboards.yaml"
	// fleetDir is the kustomize component of fleet-rules.yml.
	fleetDir       = "fleet-rules"
	fleetRulesFile = fleetDir + "/" + rulesFile
)

// notInKustomization are the files here that `kubectl apply -k` leaves out.
var notInKustomization = []string{
	"kustomization.yaml",
	"example-workload.yaml",
	"example-workload-hostpath.yaml",
	"networkpolicy.yaml",
}

func indent(text, prefix string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString(prefix)
		}
		b.WriteString(line)
	}
	return b.String()
}

const generatedHeader = `# Generated from %s by manifests_test.go: do not edit. After
# changing it, run: go -C deploy test ./kubernetes -run TestGeneratedManifests -update
#
`

// generateRules returns prometheusrule.yaml: rules.yml under a
// PrometheusRule's spec, with the comments on its rules but without its
// header, which speaks of the file.
func generateRules(t *testing.T) []byte {
	t.Helper()
	return generatePrometheusRule(t, rulesSource, "gpumem-exporter", manifestcheck.RulesComponent,
		"# The recording rules and alerts as a Prometheus Operator PrometheusRule.\n")
}

// generateFleetRules returns fleet-rules/prometheusrule.yaml, likewise
// from fleet-rules.yml.
func generateFleetRules(t *testing.T) []byte {
	t.Helper()
	return generatePrometheusRule(t, fleetSource, "gpumem-exporter-fleet", manifestcheck.FleetRulesComponent,
		"# The recording rules for large fleets (docs/scaling.md) as a Prometheus\n# Operator PrometheusRule, for the component in this directory.\n")
}

func generatePrometheusRule(t *testing.T, source, name, component, intro string) []byte {
	t.Helper()
	rules, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, generatedHeader, "deploy/"+strings.TrimPrefix(source, "../"))
	b.WriteString(intro)
	fmt.Fprintf(&b, `# kube-prometheus-stack only picks up PrometheusRules with its release label
# by default (ruleSelector): add release: <its Helm release name> below.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: %s
  namespace: gpumem
  labels:
    app.kubernetes.io/name: gpumem-exporter
    app.kubernetes.io/component: %s
    app.kubernetes.io/part-of: gpumem
spec:
`, name, component)
	b.WriteString(indent(stripHeader(string(rules)), "  "))
	return b.Bytes()
}

// stripHeader drops the comment and blank lines that open a YAML file.
func stripHeader(text string) string {
	for text != "" {
		line, rest, _ := strings.Cut(text, "\n")
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			break
		}
		text = rest
	}
	return text
}

// generateDashboards returns grafana-dashboards.yaml: one ConfigMap per
// dashboard, the JSON unchanged in a literal block.
func generateDashboards(t *testing.T) []byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", dashboardsDir, err)
	}
	sort.Strings(files)
	var b bytes.Buffer
	fmt.Fprintf(&b, generatedHeader, "dashboards/*.json")
	b.WriteString(`# One ConfigMap per dashboard, labelled for Grafana's dashboard sidecar
# (kube-prometheus-stack: grafana.sidecar.dashboards, label
# grafana_dashboard). The sidecar looks in Grafana's own namespace unless its
# searchNamespace is ALL: move these ConfigMaps there if need be.
`)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.ReplaceAll(strings.ToLower(strings.TrimSuffix(filepath.Base(f), ".json")), "_", "-")
		chomp := "|-"
		if bytes.HasSuffix(data, []byte("\n")) {
			chomp = "|"
		}
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: ConfigMap
metadata:
  name: gpumem-exporter-dashboard-%s
  namespace: gpumem
  labels:
    app.kubernetes.io/name: gpumem-exporter
    app.kubernetes.io/component: dashboards
    app.kubernetes.io/part-of: gpumem
    grafana_dashboard: "1"
data:
  %s: %s
%s`, name, filepath.Base(f), chomp, indent(strings.TrimSuffix(string(data), "\n"), "    "))
		b.WriteString("\n")
	}
	return b.Bytes()
}

// TestGeneratedManifestsAreCurrent runs first so that -update refreshes the
// files before the other tests read them.
func TestGeneratedManifestsAreCurrent(t *testing.T) {
	for file, want := range map[string][]byte{
		rulesFile: generateRules(t), dashboardsFile: generateDashboards(t), fleetRulesFile: generateFleetRules(t),
	} {
		if *update {
			if err := os.WriteFile(file, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go -C deploy test ./kubernetes -run TestGeneratedManifests -update", file)
		}
	}
}

func yamlFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("*.yml")
	return append(files, more...)
}

// TestEveryFileDecodesStrictly covers the files kustomize leaves out too.
func TestEveryFileDecodesStrictly(t *testing.T) {
	for _, f := range yamlFiles(t) {
		if f == "kustomization.yaml" {
			continue
		}
		if objs := decodeFile(t, f); len(objs) == 0 {
			t.Errorf("%s holds no object", f)
		}
	}
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v (a new field? add it here)", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: apiVersion %s kind %s", k.APIVersion, k.Kind)
	}
	var want []string
	for _, f := range yamlFiles(t) {
		if !slices.Contains(notInKustomization, f) {
			want = append(want, f)
		}
	}
	listed := slices.Clone(k.Resources)
	sort.Strings(listed)
	sort.Strings(want)
	if !slices.Equal(listed, want) {
		t.Errorf("kustomization.yaml lists %v, want every manifest but %v: %v", listed, notInKustomization, want)
	}
}

// built is `kubectl apply -k deploy/kubernetes`'s input, decoded strictly.
func built(t *testing.T) []manifestcheck.Object {
	t.Helper()
	return kustomize(t, "kustomize build", ".")
}

// kustomize builds the kustomization in dir and decodes it strictly;
// source names it in errors.
func kustomize(t *testing.T, source, dir string) []manifestcheck.Object {
	t.Helper()
	data, err := manifestcheck.Kustomize(dir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifestcheck.Decode(source, data)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// decodeFile decodes every document of a file strictly.
func decodeFile(t *testing.T, path string) []manifestcheck.Object {
	t.Helper()
	objs, err := manifestcheck.DecodeFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// rules returns the PrometheusRules of rules.yml and fleet-rules.yml in
// objs (nil where absent), failing t on any other.
func rules(t *testing.T, objs []manifestcheck.Object) (base, fleet *manifestcheck.PrometheusRule) {
	t.Helper()
	base, fleet, err := manifestcheck.Rules(objs)
	if err != nil {
		t.Fatal(err)
	}
	return base, fleet
}

func TestKustomizeBuildKeepsTheContract(t *testing.T) {
	objs := built(t)
	manifestchecktest.Report(t, manifestcheck.CheckLabels(objs))
	manifestchecktest.Report(t, manifestcheck.CheckNamespaces(objs, namespace, namespace))

	ns := manifestchecktest.One[corev1.Namespace](t, objs)
	if ns.Name != namespace {
		t.Errorf("namespace %q, want %q", ns.Name, namespace)
	}
	for _, mode := range []string{"enforce", "warn", "audit"} {
		if got := ns.Labels["pod-security.kubernetes.io/"+mode]; got != string(psaapi.LevelPrivileged) {
			t.Errorf("namespace: pod-security.kubernetes.io/%s=%q, want privileged", mode, got)
		}
	}

	ds := manifestchecktest.One[appsv1.DaemonSet](t, objs)
	manifestchecktest.Report(t, manifestcheck.CheckDaemonSet(ds, manifestcheck.DaemonSetWant{CSI: true, Image: "ghcr.io/gpumem/gpumem_exporter:0.1.0"}))
	// The namespace is privileged because nothing less admits the pod.
	if v, err := manifestcheck.PodSecurityViolations(psaapi.LevelBaseline, &ds.Spec.Template.ObjectMeta, &ds.Spec.Template.Spec); err != nil {
		t.Error(err)
	} else if v == "" {
		t.Error("Pod Security \"baseline\" admits the exporter pod: lower the namespace's level and docs/deploy.md")
	} else {
		t.Logf("baseline forbids the exporter pod, as documented: %s", v)
	}

	manifestchecktest.Report(t, manifestcheck.CheckRBAC(manifestchecktest.One[rbacv1.ClusterRole](t, objs), manifestchecktest.One[rbacv1.ClusterRoleBinding](t, objs),
		manifestchecktest.One[corev1.ServiceAccount](t, objs), ds))
	manifestchecktest.Report(t, manifestcheck.CheckService(ds, manifestchecktest.One[corev1.Service](t, objs), manifestchecktest.One[manifestcheck.ServiceMonitor](t, objs), nil))
	manifestchecktest.Report(t, manifestcheck.CheckCSIDriver(manifestchecktest.One[storagev1.CSIDriver](t, objs), manifestcheck.DefaultDriverName))
	manifestchecktest.Report(t, manifestcheck.CheckPrometheusRule(manifestchecktest.One[manifestcheck.PrometheusRule](t, objs), rulesSource, nil))
	manifestchecktest.Report(t, manifestcheck.CheckDashboards(manifestcheck.All[corev1.ConfigMap](objs), dashboardsDir, "grafana_dashboard", "1"))
	manifestchecktest.Report(t, manifestcheck.None[networkingv1.NetworkPolicy](objs))
}

func exampleJob(t *testing.T, file string) *batchv1.Job {
	t.Helper()
	return manifestchecktest.One[batchv1.Job](t, decodeFile(t, file))
}

func TestExampleWorkloads(t *testing.T) {
	objs := built(t)
	driver := manifestchecktest.One[storagev1.CSIDriver](t, objs).Name
	for _, tc := range []struct {
		file string
		want manifestcheck.WorkloadWant
	}{
		// Admitted by Pod Security "restricted".
		{"example-workload.yaml", manifestcheck.WorkloadWant{DriverName: driver, PythonPath: manifestcheck.SocketDir + "/python/autostart"}},
		// Needs a privileged namespace.
		{"example-workload-hostpath.yaml", manifestcheck.WorkloadWant{}},
	} {
		t.Run(strings.TrimSuffix(tc.file, ".yaml"), func(t *testing.T) {
			job := exampleJob(t, tc.file)
			if job.Namespace != "" {
				t.Errorf("the example names namespace %q: leave it to kubectl -n", job.Namespace)
			}
			manifestchecktest.Report(t, manifestcheck.CheckWorkload(&job.Spec.Template.ObjectMeta, &job.Spec.Template.Spec, tc.want))
		})
	}
}

func TestNetworkPolicyExample(t *testing.T) {
	np := manifestchecktest.One[networkingv1.NetworkPolicy](t, decodeFile(t, "networkpolicy.yaml"))
	manifestchecktest.Report(t, manifestcheck.CheckNetworkPolicy(np, manifestchecktest.One[appsv1.DaemonSet](t, built(t)), networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "prometheus"}},
	}))
}

// TestCSIFlagsExist: every flag the csi-node container passes is one that
// gpumem-csi defines (read from its sources; the exporter's flags are
// checked elsewhere, and listed in docs/deploy.md).
func TestCSIFlagsExist(t *testing.T) {
	sources, err := filepath.Glob("../../cmd/gpumem-csi/*.go")
	if err != nil {
		t.Fatal(err)
	}
	flagCall := regexp.MustCompile(`\bFlag\("([a-z0-9.\-]+)"`)
	defined := map[string]bool{}
	for _, f := range sources {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagCall.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
	}
	if !defined["csi.endpoint"] {
		t.Fatalf("found no csi.endpoint flag in cmd/gpumem-csi (%d flags): did the binary move?", len(defined))
	}
	ds := manifestchecktest.One[appsv1.DaemonSet](t, built(t))
	for _, c := range ds.Spec.Template.Spec.InitContainers {
		if c.Name != manifestcheck.CSIContainer {
			continue
		}
		for _, a := range c.Args {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !strings.HasPrefix(a, "--") || !defined[name] {
				t.Errorf("%s: %s is not a flag of gpumem-csi", c.Name, a)
			}
		}
	}
}

// TestDocumentedOverlayBuilds builds the overlay that docs/deploy.md shows
// for kube-prometheus-stack and a private registry, and checks its effect.
func TestDocumentedOverlayBuilds(t *testing.T) {
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "# my-overlay/kustomization.yaml\n"
	start := bytes.Index(doc, []byte(marker))
	if start < 0 {
		t.Fatalf("docs/deploy.md has no %q block", strings.TrimSpace(marker))
	}
	end := bytes.Index(doc[start:], []byte("```"))
	if end < 0 {
		t.Fatal("the overlay's code block in docs/deploy.md does not end")
	}
	overlay := string(doc[start : start+end])

	// The overlay sits beside the repository's deploy/ in the docs.
	dir := t.TempDir()
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, here)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(overlay, "- ../deploy/kubernetes\n") {
		t.Fatalf("the overlay in docs/deploy.md does not list ../deploy/kubernetes:\n%s", overlay)
	}
	overlay = strings.Replace(overlay, "- ../deploy/kubernetes\n", "- "+filepath.ToSlash(rel)+"\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := kustomize(t, "the documented overlay", dir)
	release := map[string]string{"release": "kube-prometheus-stack"}
	ds := manifestchecktest.One[appsv1.DaemonSet](t, objs)
	manifestchecktest.Report(t, manifestcheck.CheckService(ds, manifestchecktest.One[corev1.Service](t, objs), manifestchecktest.One[manifestcheck.ServiceMonitor](t, objs), release))
	manifestchecktest.Report(t, manifestcheck.CheckPrometheusRule(manifestchecktest.One[manifestcheck.PrometheusRule](t, objs), rulesSource, release))
	manifestchecktest.Report(t, manifestcheck.CheckDaemonSet(ds, manifestcheck.DaemonSetWant{CSI: true, Image: "registry.example.com/gpumem_exporter:0.1.0"}))
}

// The fleet-rules component adds the PrometheusRule of fleet-rules.yml
// to an overlay of this directory, beside rules.yml's.
func TestFleetRulesComponentBuilds(t *testing.T) {
	dir := t.TempDir()
	rel := func(p string) string {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(dir, abs)
		if err != nil {
			t.Fatal(err)
		}
		return filepath.ToSlash(r)
	}
	overlay := fmt.Sprintf("resources:\n  - %s\ncomponents:\n  - %s\n", rel("."), rel(fleetDir))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := kustomize(t, "an overlay with the fleet-rules component", dir)
	manifestchecktest.Report(t, manifestcheck.CheckLabels(objs))
	manifestchecktest.Report(t, manifestcheck.CheckNamespaces(objs, namespace, namespace))
	base, fleet := rules(t, objs)
	if base == nil || fleet == nil {
		t.Fatalf("PrometheusRules: rules.yml's %v, fleet-rules.yml's %v; want both", base != nil, fleet != nil)
	}
	manifestchecktest.Report(t, manifestcheck.CheckPrometheusRule(base, rulesSource, nil))
	manifestchecktest.Report(t, manifestcheck.CheckPrometheusRule(fleet, fleetSource, nil))

	if base, fleet := rules(t, built(t)); base == nil || fleet != nil {
		t.Error("kubectl apply -k deploy/kubernetes: want rules.yml's PrometheusRule only")
	}
}
