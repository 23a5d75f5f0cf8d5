package manifestcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/gpumem/gpumem_exporter/internal/defaults"
)

// Selects reports whether every key=value of selector is in labels (an
// empty selector selects nothing here: the deployment never means "all").
func Selects(selector, labels map[string]string) bool {
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

// NoOOMEventsFlag is the exporter flag that turns off the Events on pods.
const NoOOMEventsFlag = "--no-kubernetes.oom-events"

// OOMEvents reports whether the DaemonSet's exporter records Events on
// pods (--kubernetes.oom-events is on by default).
func OOMEvents(ds *appsv1.DaemonSet) bool {
	c := container(ds.Spec.Template.Spec.Containers, ExporterContainer)
	return c == nil || !slices.Contains(c.Args, NoOOMEventsFlag)
}

// CheckRBAC checks that the ClusterRole grants exactly list and watch on
// pods, and create and patch on events where the exporter records Events
// on pods (and nothing on events where it does not), and that its binding
// gives it to the DaemonSet's service account.
func CheckRBAC(role *rbacv1.ClusterRole, binding *rbacv1.ClusterRoleBinding, sa *corev1.ServiceAccount, ds *appsv1.DaemonSet) error {
	var p problems
	if role.AggregationRule != nil {
		p.addf("the ClusterRole must not aggregate other roles")
	}
	type rule struct {
		resource, why string
		verbs         []string
	}
	wants := []rule{{"pods", "list and watch on core pods (no get: the informer does not need it)", []string{"list", "watch"}}}
	if OOMEvents(ds) {
		wants = append(wants, rule{"events", "create and patch on core events (the OOM Event on a pod, and its count)", []string{"create", "patch"}})
	}
	if len(role.Rules) != len(wants) {
		p.addf("the ClusterRole has %d rules, want %d (pods; events unless %s)", len(role.Rules), len(wants), NoOOMEventsFlag)
		return p.err()
	}
	for i, w := range wants {
		r := role.Rules[i]
		verbs := slices.Clone(r.Verbs)
		sort.Strings(verbs)
		if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.Resources, []string{w.resource}) ||
			!slices.Equal(verbs, w.verbs) || len(r.ResourceNames) != 0 || len(r.NonResourceURLs) != 0 {
			p.addf("ClusterRole rule %+v, want exactly %s", r, w.why)
		}
	}
	if binding.RoleRef.APIGroup != rbacv1.GroupName || binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name {
		p.addf("ClusterRoleBinding roleRef %+v, want ClusterRole %s", binding.RoleRef, role.Name)
	}
	want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: ds.Spec.Template.Spec.ServiceAccountName, Namespace: ds.Namespace}
	if len(binding.Subjects) != 1 || binding.Subjects[0] != want {
		p.addf("ClusterRoleBinding subjects %+v, want [%+v]", binding.Subjects, want)
	}
	if sa.Name != want.Name || sa.Namespace != want.Namespace {
		p.addf("ServiceAccount %s/%s, but the binding names %s/%s", sa.Namespace, sa.Name, want.Namespace, want.Name)
	}
	return p.err()
}

// CheckService checks the headless Service and the ServiceMonitor that
// scrapes it. wantLabels must all be on the ServiceMonitor (e.g. release).
func CheckService(ds *appsv1.DaemonSet, svc *corev1.Service, sm *ServiceMonitor, wantLabels map[string]string) error {
	var p problems
	podLabels := ds.Spec.Template.Labels
	if !Selects(svc.Spec.Selector, podLabels) {
		p.addf("the Service's selector %v does not select the DaemonSet's pods %v", svc.Spec.Selector, podLabels)
	}
	if svc.Namespace != ds.Namespace {
		p.addf("the Service is in %q, the DaemonSet in %q", svc.Namespace, ds.Namespace)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		p.addf("the Service must be headless, clusterIP %q", svc.Spec.ClusterIP)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		p.addf("publishNotReadyAddresses must be true: an exporter whose NVML is down must still be scraped")
	}
	if len(svc.Spec.Ports) != 1 {
		p.addf("the Service has %d ports, want 1 (metrics; the health port is the kubelet's)", len(svc.Spec.Ports))
		return p.err()
	}
	sp := svc.Spec.Ports[0]
	if sp.Name != "metrics" || sp.Port != MetricsPort || (sp.TargetPort != intstr.FromString("metrics") && sp.TargetPort != intstr.FromInt32(MetricsPort)) {
		p.addf("Service port %+v, want metrics %d to the container's metrics port", sp, MetricsPort)
	}
	if sm == nil {
		return p.err()
	}

	if sm.Namespace != svc.Namespace && (sm.Spec.NamespaceSelector == nil || !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace)) {
		p.addf("the ServiceMonitor in %s does not look in the Service's namespace %s", sm.Namespace, svc.Namespace)
	}
	if len(sm.Spec.Selector.MatchExpressions) != 0 || !Selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
		p.addf("the ServiceMonitor's selector %+v does not select the Service's labels %v", sm.Spec.Selector, svc.Labels)
	}
	for k, v := range wantLabels {
		if got, ok := sm.Labels[k]; !ok || got != v {
			p.addf("the ServiceMonitor's label %s=%q, want %q", k, got, v)
		}
	}
	if sm.Spec.SampleLimit == nil || *sm.Spec.SampleLimit == 0 {
		p.addf("the ServiceMonitor must set sampleLimit: one node must not be able to flood Prometheus")
	}
	if len(sm.Spec.Endpoints) != 1 {
		p.addf("the ServiceMonitor has %d endpoints, want 1", len(sm.Spec.Endpoints))
		return p.err()
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != sp.Name {
		p.addf("the ServiceMonitor scrapes port %q, the Service's is %q", ep.Port, sp.Name)
	}
	if !ep.HonorLabels {
		p.addf("honorLabels must be true: the workload's namespace and pod labels must win over the target's")
	}
	if ep.Path != "" && ep.Path != defaults.TelemetryPath {
		p.addf("scrape path %s, the exporter serves %s", ep.Path, defaults.TelemetryPath)
	}
	return p.err()
}

// CheckCSIDriver checks the CSIDriver object of the node plugin.
func CheckCSIDriver(d *storagev1.CSIDriver, name string) error {
	var p problems
	if d.Name != name {
		p.addf("CSIDriver %s, want %s", d.Name, name)
	}
	s := d.Spec
	if !isFalse(s.AttachRequired) {
		p.addf("CSIDriver: attachRequired must be false (nothing to attach)")
	}
	if !isTrue(s.PodInfoOnMount) {
		p.addf("CSIDriver: podInfoOnMount must be true (the plugin learns the pod it publishes for)")
	}
	if !slices.Equal(s.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}) {
		p.addf("CSIDriver: volumeLifecycleModes %v, want [Ephemeral] (inline volumes only)", s.VolumeLifecycleModes)
	}
	if s.FSGroupPolicy == nil || *s.FSGroupPolicy != storagev1.NoneFSGroupPolicy {
		p.addf("CSIDriver: fsGroupPolicy %v, want None (the kubelet must not chown the socket directory)", deref(s.FSGroupPolicy))
	}
	return p.err()
}

// ReadRules decodes a Prometheus rules file strictly.
func ReadRules(path string) (RulesFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return RulesFile{}, err
	}
	var rf RulesFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		return RulesFile{}, fmt.Errorf("%s: %w", path, err)
	}
	if len(rf.Groups) == 0 {
		return RulesFile{}, fmt.Errorf("%s has no groups", path)
	}
	return rf, nil
}

// CheckPrometheusRule checks that the PrometheusRule holds exactly the
// groups of the rules file, alert templates ({{ $labels.x }}) included.
func CheckPrometheusRule(pr *PrometheusRule, rulesFile string, wantLabels map[string]string) error {
	want, err := ReadRules(rulesFile)
	if err != nil {
		return err
	}
	var p problems
	for _, d := range ruleDiffs(pr.Spec, want) {
		p.addf("PrometheusRule %s differs from %s (a stale copy?): %s", pr.Name, rulesFile, d)
	}
	for k, v := range wantLabels {
		if got, ok := pr.Labels[k]; !ok || got != v {
			p.addf("the PrometheusRule's label %s=%q, want %q", k, got, v)
		}
	}
	return p.err()
}

// Rule components: the app.kubernetes.io/component of the PrometheusRule
// of rules.yml and of the one of fleet-rules.yml.
const (
	RulesComponent      = "rules"
	FleetRulesComponent = "fleet-rules"
)

// Rules returns the PrometheusRule of rules.yml and that of
// fleet-rules.yml (nil where absent), told apart by their component
// label, or an error on another PrometheusRule or a second of one kind.
func Rules(objs []Object) (rules, fleet *PrometheusRule, err error) {
	for _, pr := range All[PrometheusRule](objs) {
		var dst **PrometheusRule
		switch c := pr.Labels["app.kubernetes.io/component"]; c {
		case RulesComponent:
			dst = &rules
		case FleetRulesComponent:
			dst = &fleet
		default:
			return nil, nil, fmt.Errorf("PrometheusRule %s has component %q, want %s or %s", pr.Name, c, RulesComponent, FleetRulesComponent)
		}
		if *dst != nil {
			return nil, nil, fmt.Errorf("two PrometheusRules of component %s: %s and %s", pr.Labels["app.kubernetes.io/component"], (*dst).Name, pr.Name)
		}
		*dst = pr
	}
	return rules, fleet, nil
}

// ruleDiffs names the groups and rules that differ, at most a few.
func ruleDiffs(got, want RulesFile) []string {
	var out []string
	name := func(r Rule) string { return r.Record + r.Alert }
	if len(got.Groups) != len(want.Groups) {
		out = append(out, fmt.Sprintf("%d groups, want %d", len(got.Groups), len(want.Groups)))
	}
	for i := 0; i < len(got.Groups) && i < len(want.Groups) && len(out) < 5; i++ {
		g, w := got.Groups[i], want.Groups[i]
		if g.Name != w.Name || g.Interval != w.Interval || !reflect.DeepEqual(g.Limit, w.Limit) || len(g.Rules) != len(w.Rules) {
			out = append(out, fmt.Sprintf("group %d is %s with %d rules, want %s with %d", i, g.Name, len(g.Rules), w.Name, len(w.Rules)))
			continue
		}
		for j := range g.Rules {
			if !reflect.DeepEqual(g.Rules[j], w.Rules[j]) {
				gy, _ := yaml.Marshal(g.Rules[j])
				wy, _ := yaml.Marshal(w.Rules[j])
				out = append(out, fmt.Sprintf("group %s, rule %s:\n--- got\n%s--- want\n%s", g.Name, name(w.Rules[j]), gy, wy))
			}
		}
	}
	return out
}

// CheckDashboards checks that there is one ConfigMap per *.json file of
// dir, holding the file unchanged under its own name and labelled for
// Grafana's sidecar, and no other dashboard ConfigMap.
func CheckDashboards(cms []*corev1.ConfigMap, dir, label, value string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no dashboards in %s (%v)", dir, err)
	}
	var p problems
	byKey := map[string]*corev1.ConfigMap{}
	for _, cm := range cms {
		if cm.Labels[label] != value {
			continue
		}
		if len(cm.Data) != 1 || len(cm.BinaryData) != 0 {
			p.addf("dashboard ConfigMap %s holds %d keys, want one dashboard", cm.Name, len(cm.Data)+len(cm.BinaryData))
		}
		for k := range cm.Data {
			if byKey[k] != nil {
				p.addf("dashboard %s is in two ConfigMaps, %s and %s", k, byKey[k].Name, cm.Name)
			}
			byKey[k] = cm
		}
	}
	for _, f := range files {
		key := filepath.Base(f)
		cm := byKey[key]
		if cm == nil {
			p.addf("no ConfigMap labelled %s=%q holds %s", label, value, key)
			continue
		}
		delete(byKey, key)
		want, err := os.ReadFile(f)
		if err != nil {
			p.add(err)
			return p.err()
		}
		if got := cm.Data[key]; got != string(want) {
			p.addf("ConfigMap %s: %s differs from %s (%d bytes, want %d)", cm.Name, key, f, len(got), len(want))
		}
		if !json.Valid([]byte(cm.Data[key])) {
			p.addf("ConfigMap %s: %s is not valid JSON", cm.Name, key)
		}
	}
	for key, cm := range byKey {
		p.addf("ConfigMap %s holds dashboard %s, which %s does not have", cm.Name, key, dir)
	}
	return p.err()
}

// CheckNetworkPolicy checks that the policy isolates the exporter pods and
// admits only the given peer, only to the metrics port.
func CheckNetworkPolicy(np *networkingv1.NetworkPolicy, ds *appsv1.DaemonSet, wantPeer networkingv1.NetworkPolicyPeer) error {
	var p problems
	if np.Namespace != ds.Namespace {
		p.addf("the NetworkPolicy is in %q, the DaemonSet in %q", np.Namespace, ds.Namespace)
	}
	if len(np.Spec.PodSelector.MatchExpressions) != 0 || !Selects(np.Spec.PodSelector.MatchLabels, ds.Spec.Template.Labels) {
		p.addf("the NetworkPolicy's podSelector %+v does not select the exporter pods %v", np.Spec.PodSelector, ds.Spec.Template.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		p.addf("policyTypes %v, want [Ingress]", np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 1 {
		p.addf("the NetworkPolicy has %d ingress rules, want 1", len(np.Spec.Ingress))
		return p.err()
	}
	in := np.Spec.Ingress[0]
	if len(in.From) != 1 || !reflect.DeepEqual(in.From[0], wantPeer) {
		p.addf("ingress from %+v, want only %+v", in.From, wantPeer)
	}
	if len(in.From) == 1 && in.From[0].PodSelector == nil && in.From[0].NamespaceSelector == nil && in.From[0].IPBlock == nil {
		p.addf("an empty peer admits everyone")
	}
	if len(in.Ports) != 1 || in.Ports[0].Port == nil ||
		(*in.Ports[0].Port != intstr.FromString("metrics") && *in.Ports[0].Port != intstr.FromInt32(MetricsPort)) {
		p.addf("ingress ports %+v, want only metrics (%d)", in.Ports, MetricsPort)
	}
	return p.err()
}

// CheckLabels checks that every object carries app.kubernetes.io/part-of=gpumem.
func CheckLabels(objs []Object) error {
	var p problems
	for _, o := range objs {
		m := o.Meta()
		if m == nil {
			continue
		}
		if m.GetName() == "" {
			p.addf("%s: a %s without a name", o.Source, o.Kind)
		}
		if m.GetLabels()["app.kubernetes.io/part-of"] != "gpumem" {
			p.addf("%s: %s %s lacks the label app.kubernetes.io/part-of=gpumem", o.Source, o.Kind, m.GetName())
		}
	}
	return p.err()
}

// CheckNamespaces checks that cluster-scoped objects have no namespace and
// every other one is in ns (dashboard ConfigMaps may go elsewhere, for
// Grafana's sidecar: dashboardsNS).
func CheckNamespaces(objs []Object, ns, dashboardsNS string) error {
	var p problems
	for _, o := range objs {
		m := o.Meta()
		if m == nil {
			continue
		}
		want := ns
		switch o.Kind {
		case "Namespace", "ClusterRole", "ClusterRoleBinding", "CSIDriver":
			want = ""
		case "ConfigMap":
			want = dashboardsNS
		}
		if m.GetNamespace() != want {
			p.addf("%s: %s %s is in namespace %q, want %q", o.Source, o.Kind, m.GetName(), m.GetNamespace(), want)
		}
	}
	return p.err()
}

// SameFile reports whether two files have the same bytes: false if b
// cannot be read, an error if a cannot.
func SameFile(a, b string) (bool, error) {
	da, err := os.ReadFile(a)
	if err != nil {
		return false, err
	}
	db, err := os.ReadFile(b)
	if err != nil {
		return false, nil
	}
	return bytes.Equal(da, db), nil
}
