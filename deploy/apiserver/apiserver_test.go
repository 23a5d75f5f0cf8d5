package apiserver

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

const (
	kustomizeDir = "../kubernetes"
	chartDir     = "../helm/gpumem-exporter"
	crdFile      = "testdata/prometheus-operator-crds.yaml"
	// The chart is installed as `helm install gpumem-exporter
	// deploy/helm/gpumem-exporter -n gpumem-helm` would: default values.
	helmRelease   = "gpumem-exporter"
	helmNamespace = "gpumem-helm"
)

// TestAPIServer runs everything on one API server, one step after the
// other: starting it takes most of the time.
func TestAPIServer(t *testing.T) {
	c := startCluster(t)
	installCRDs(t, c)

	t.Run("strict field validation refuses misspelt fields", func(t *testing.T) { testStrict(t, c) })
	t.Run("example workloads under Pod Security", func(t *testing.T) { testPodSecurity(t, c) })

	built, err := manifestcheck.Kustomize(kustomizeDir)
	if err != nil {
		t.Fatal(err)
	}
	kustomized := splitDocuments(t, "kustomize build deploy/kubernetes", built)
	t.Run("kustomize build applies", func(t *testing.T) {
		c.applyAll(t, kustomized)
		if !t.Failed() {
			checkServiceAccount(t, c, kustomized)
			ns, name := serviceAccount(t, kustomized)
			t.Run("an OOM Event on a pod, as the exporter", func(t *testing.T) { testOOMEvent(t, c, "system:serviceaccount:"+ns+":"+name) })
		}
	})
	// The component an overlay adds for large fleets: its PrometheusRule.
	fleetFile := kustomizeDir + "/fleet-rules/prometheusrule.yaml"
	fleetData, err := os.ReadFile(fleetFile)
	if err != nil {
		t.Fatal(err)
	}
	fleet := splitDocuments(t, fleetFile, fleetData)
	t.Run("the fleet-rules component applies", func(t *testing.T) { c.applyAll(t, fleet) })
	// Uninstall, but for the namespace: the chart's cluster-wide objects
	// (ClusterRole, ClusterRoleBinding, CSIDriver) have the same names.
	c.deleteAll(t, append(kustomized, fleet...))

	t.Run("helm chart applies", func(t *testing.T) {
		rendered := renderChart(t, c)
		// helm install creates no namespace; NOTES.txt says it must be
		// privileged.
		c.applyAll(t, []document{namespaceDoc(helmNamespace, "privileged")})
		c.applyAll(t, rendered)
		if !t.Failed() {
			checkServiceAccount(t, c, rendered)
		}
	})
}

// installCRDs installs the stand-ins for the Prometheus Operator's CRDs and
// waits until the server serves them.
func installCRDs(t *testing.T, c *cluster) {
	t.Helper()
	data, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	crds := splitDocuments(t, crdFile, data)
	c.applyAll(t, crds)
	if t.Failed() {
		t.FailNow()
	}
	for _, d := range crds {
		r, err := c.resource(d, "")
		if err != nil {
			t.Fatal(err)
		}
		poll(t, "CRD "+d.obj.GetName()+" established", func(ctx context.Context) (bool, error) {
			u, err := r.Get(ctx, d.obj.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
	}
	c.mapper.Reset() // discovery again, now with monitoring.coreos.com
}

// testStrict checks that apply, as the tests below use it, fails on a
// misspelt field, also in the stand-in CRDs (else they would prove nothing),
// and on a duplicate field. Server-side apply refuses a field missing from
// the schema in any case; fieldValidation=Strict adds duplicates, which
// would otherwise be a warning.
func testStrict(t *testing.T, c *cluster) {
	for _, tc := range []struct{ raw, want string }{
		{`apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: misspelt, namespace: default}
spec:
  selector: {matchLabels: {app: x}}
  endpoints:
    - port: metrics
      honourLabels: true
`, `.spec.endpoints[0].honourLabels: field not declared in schema`},
		{`apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: misspelt, namespace: default}
spec:
  groups:
    - name: g
      rules:
        - alert: A
          expr: up == 0
          keepFiringFor: 5m
`, `.rules[0].keepFiringFor: field not declared in schema`},
		{`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: misspelt, namespace: default}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      hostPid: true
      containers: [{name: c, image: x}]
`, `.spec.template.spec.hostPid: field not declared in schema`},
		{`apiVersion: v1
kind: ConfigMap
metadata: {name: duplicate, namespace: default}
data: {a: "1"}
data: {b: "2"}
`, `key "data" already set in map`},
	} {
		docs := splitDocuments(t, "a bad document", []byte(tc.raw))
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		_, err := c.apply(ctx, docs[0], "")
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want an error with %q, got %v", docs[0], tc.want, err)
		}
	}
}

// namespaceDoc is a Namespace whose Pod Security level is enforced and
// warned about.
func namespaceDoc(name, level string) document {
	raw := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %s
  labels:
    pod-security.kubernetes.io/enforce: %s
    pod-security.kubernetes.io/warn: %s
`, name, level, level)
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("Namespace")
	u.SetName(name)
	return document{source: "namespace " + name, raw: []byte(raw), obj: u}
}

// testPodSecurity creates the example workloads in namespaces of each Pod
// Security level. A Job is only warned about (its pods are what admission
// enforces, and no kube-controller-manager runs here to create them), so
// each case also creates a Pod from the Job's pod template.
func testPodSecurity(t *testing.T, c *cluster) {
	cases := []struct {
		file  string
		level string
		// forbidden: the words that admission's refusal must contain;
		// empty: the pod is admitted without warnings.
		forbidden string
	}{
		{"example-workload.yaml", "restricted", ""},
		{"example-workload-hostpath.yaml", "restricted", `volume "gpumem-socket" uses restricted volume type "hostPath"`},
		{"example-workload-hostpath.yaml", "baseline", `hostPath volumes (volume "gpumem-socket")`},
		{"example-workload-hostpath.yaml", "privileged", ""},
	}
	for _, tc := range cases {
		ns := "jobs-" + tc.level
		t.Run(tc.file+" in a "+tc.level+" namespace", func(t *testing.T) {
			c.applyAll(t, []document{namespaceDoc(ns, tc.level)})
			// kube-controller-manager would create the default
			// ServiceAccount, which the ServiceAccount admission plugin
			// wants before it admits a pod.
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			_, err := create(ctx, c.dynamic.Resource(serviceAccounts).Namespace(ns), &corev1.ServiceAccount{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
				ObjectMeta: metav1.ObjectMeta{Name: "default"},
			}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}

			path := kustomizeDir + "/" + tc.file
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			docs := splitDocuments(t, tc.file, data)
			if len(docs) != 1 || docs[0].obj.GetKind() != "Job" {
				t.Fatalf("%s: want one Job, got %d documents", tc.file, len(docs))
			}
			warnings, err := c.apply(ctx, docs[0], ns)
			if err != nil {
				t.Fatal(err)
			}
			warned := strings.Join(warnings, "\n")
			switch {
			case tc.forbidden == "" && warned != "":
				t.Errorf("the Job drew warnings in a %s namespace:\n%s", tc.level, warned)
			case tc.forbidden != "" && !strings.Contains(warned, tc.forbidden):
				t.Errorf("the Job's warnings in a %s namespace do not mention %q:\n%s", tc.level, tc.forbidden, warned)
			}

			objs, err := manifestcheck.DecodeFile(path)
			if err != nil {
				t.Fatal(err)
			}
			job, err := manifestcheck.One[batchv1.Job](objs)
			if err != nil {
				t.Fatal(err)
			}
			pod := &corev1.Pod{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{Name: job.Name, Labels: job.Spec.Template.Labels},
				Spec:       job.Spec.Template.Spec,
			}
			c.warnings.take()
			_, err = create(ctx, c.dynamic.Resource(pods).Namespace(ns), pod, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
			switch {
			case tc.forbidden == "" && err != nil:
				t.Errorf("the Job's pod was not admitted in a %s namespace: %v", tc.level, err)
			case tc.forbidden == "":
				if w := c.warnings.take(); len(w) > 0 {
					t.Errorf("the Job's pod drew warnings in a %s namespace:\n%s", tc.level, strings.Join(w, "\n"))
				}
			case err == nil:
				t.Errorf("the Job's pod was admitted in a %s namespace; want Forbidden for %s", tc.level, tc.forbidden)
			case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.forbidden):
				t.Errorf("the Job's pod in a %s namespace: want Forbidden for %s, got: %v", tc.level, tc.forbidden, err)
			default:
				t.Logf("refused as it should be: %v", err)
			}
		})
	}
}

// renderChart renders the chart with its default values for the server's
// Kubernetes version, as helm install does.
func renderChart(t *testing.T, c *cluster) []document {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = c.kubeVersion
	vals, err := chartutil.ToRenderValues(chrt, map[string]any{},
		chartutil.ReleaseOptions{Name: helmRelease, Namespace: helmNamespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(chrt, vals)
	if err != nil {
		t.Fatalf("rendering the chart: %v", err)
	}
	var names []string
	for name := range out {
		if !strings.HasSuffix(name, "NOTES.txt") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var docs []document
	for _, name := range names {
		docs = append(docs, splitDocuments(t, name, []byte(out[name]))...)
	}
	if len(docs) == 0 {
		t.Fatal("the chart rendered nothing")
	}
	return docs
}

// serviceAccount returns the namespace and name of the ServiceAccount that
// the docs' only ClusterRoleBinding binds.
func serviceAccount(t *testing.T, docs []document) (string, string) {
	t.Helper()
	var found []string
	for _, d := range docs {
		if d.obj.GetKind() != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(d.obj.Object, "subjects")
		for _, s := range subjects {
			m, _ := s.(map[string]any)
			if m["kind"] == "ServiceAccount" {
				found = append(found, fmt.Sprintf("%v/%v", m["namespace"], m["name"]))
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one ServiceAccount bound by a ClusterRoleBinding, found %v", found)
	}
	ns, name, _ := strings.Cut(found[0], "/")
	return ns, name
}

// access is one request's attributes.
type access struct {
	verb, group, resource, subresource, namespace string
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.namespace == "" {
		return a.verb + " " + r + " (all namespaces)"
	}
	return a.verb + " " + r + " in " + a.namespace
}

// checkServiceAccount checks, through the API server's authorizer, that the
// exporter's ServiceAccount may list and watch pods and create and patch
// events in every namespace, and nothing more than any ServiceAccount may.
func checkServiceAccount(t *testing.T, c *cluster, docs []document) {
	t.Helper()
	ns, name := serviceAccount(t, docs)
	user := "system:serviceaccount:" + ns + ":" + name
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	allowed := []access{
		{verb: "list", resource: "pods"},
		{verb: "watch", resource: "pods"},
		{verb: "list", resource: "pods", namespace: "jobs-restricted"},
		{verb: "watch", resource: "pods", namespace: "kube-system"},
		// The Event on a pod of an OOM, and its count on a repeat.
		{verb: "create", resource: "events", namespace: "jobs-restricted"},
		{verb: "patch", resource: "events", namespace: "jobs-restricted"},
	}
	denied := []access{
		// No get: RBAC does not enforce the informer's field selector.
		{verb: "get", resource: "pods"},
		{verb: "get", resource: "pods", namespace: "jobs-restricted"},
		{verb: "create", resource: "pods", namespace: ns},
		{verb: "update", resource: "pods", namespace: ns},
		{verb: "patch", resource: "pods", namespace: ns},
		{verb: "delete", resource: "pods", namespace: ns},
		{verb: "deletecollection", resource: "pods", namespace: ns},
		{verb: "get", resource: "pods", subresource: "log", namespace: ns},
		{verb: "create", resource: "pods", subresource: "exec", namespace: ns},
		{verb: "create", resource: "pods", subresource: "eviction", namespace: ns},
		{verb: "list", resource: "secrets"},
		{verb: "get", resource: "secrets", namespace: ns},
		{verb: "watch", resource: "secrets", namespace: ns},
		{verb: "list", resource: "configmaps", namespace: ns},
		{verb: "list", resource: "nodes"},
		{verb: "get", resource: "nodes", subresource: "proxy"},
		{verb: "list", resource: "services"},
		{verb: "list", resource: "endpointslices", group: "discovery.k8s.io"},
		{verb: "get", resource: "events", namespace: "jobs-restricted"},
		{verb: "list", resource: "events"},
		{verb: "watch", resource: "events", namespace: "jobs-restricted"},
		{verb: "update", resource: "events", namespace: "jobs-restricted"},
		{verb: "delete", resource: "events", namespace: "jobs-restricted"},
		{verb: "deletecollection", resource: "events", namespace: "jobs-restricted"},
		{verb: "create", resource: "events", group: "events.k8s.io", namespace: "jobs-restricted"},
		{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: ns},
		{verb: "list", resource: "daemonsets", group: "apps"},
		{verb: "impersonate", resource: "users"},
		{verb: "create", resource: "tokenreviews", group: "authentication.k8s.io"},
		{verb: "create", resource: "subjectaccessreviews", group: "authorization.k8s.io"},
		{verb: "list", resource: "csidrivers", group: "storage.k8s.io"},
	}
	check := func(a access, want bool) {
		sar := &authorizationv1.SubjectAccessReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SubjectAccessReview"},
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   user,
				Groups: groups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace,
				},
			},
		}
		got, err := create(ctx, c.dynamic.Resource(subjectAccessReviews), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		if got.Status.Allowed != want {
			t.Errorf("%s may %s: %v, want %v (%s)", user, a, got.Status.Allowed, want, got.Status.Reason)
		}
	}
	for _, a := range allowed {
		check(a, true)
	}
	for _, a := range denied {
		check(a, false)
	}

	// Everything else: its rules, less those any ServiceAccount has.
	exporter := impersonate(t, c, user)
	other := impersonate(t, c, "system:serviceaccount:"+ns+":gpumem-test-other")
	for _, where := range []string{ns, "jobs-restricted"} {
		extra := difference(rules(ctx, t, exporter, where), rules(ctx, t, other, where))
		want := []string{"create events", "list pods", "patch events", "watch pods"}
		if strings.Join(extra, ", ") != strings.Join(want, ", ") {
			t.Errorf("SelfSubjectRulesReview in %s: %s may %q beyond what every ServiceAccount may; want %q", where, user, extra, want)
		}
	}

	// And as the exporter would do it: list and watch its node's pods.
	opts := metav1.ListOptions{FieldSelector: "spec.nodeName=gpu-node-1"}
	if _, err := exporter.Resource(pods).List(ctx, opts); err != nil {
		t.Errorf("as %s: list pods on a node: %v", user, err)
	}
	w, err := exporter.Resource(pods).Watch(ctx, opts)
	if err != nil {
		t.Errorf("as %s: watch pods on a node: %v", user, err)
	} else {
		w.Stop()
	}
	if _, err := exporter.Resource(pods).Namespace("jobs-restricted").Get(ctx, "gpumem-example", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("as %s: get a pod: want Forbidden, got %v", user, err)
	}
	if _, err := exporter.Resource(secrets).Namespace(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("as %s: list secrets: want Forbidden, got %v", user, err)
	}
}

// impersonate returns a client acting as user (a ServiceAccount's name: the
// API server adds its groups).
func impersonate(t *testing.T, c *cluster, user string) dynamic.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// rules returns what the client may do in ns, one "verb resource[.group]
// [names]" or "verb URL" per entry, sorted.
func rules(ctx context.Context, t *testing.T, client dynamic.Interface, ns string) []string {
	t.Helper()
	r, err := create(ctx, client.Resource(selfSubjectRulesReviews), &authorizationv1.SelfSubjectRulesReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectRulesReview"},
		Spec:     authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectRulesReview: %v", err)
	}
	if r.Status.Incomplete {
		t.Fatalf("SelfSubjectRulesReview incomplete: %s", r.Status.EvaluationError)
	}
	set := map[string]bool{}
	for _, rr := range r.Status.ResourceRules {
		names := ""
		if len(rr.ResourceNames) > 0 {
			names = " " + strings.Join(rr.ResourceNames, ",")
		}
		for _, v := range rr.Verbs {
			for _, g := range rr.APIGroups {
				for _, res := range rr.Resources {
					if g != "" {
						res += "." + g
					}
					set[v+" "+res+names] = true
				}
			}
		}
	}
	for _, nr := range r.Status.NonResourceRules {
		for _, v := range nr.Verbs {
			for _, u := range nr.NonResourceURLs {
				set[v+" "+u] = true
			}
		}
	}
	var out []string
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// difference returns the entries of a that are not in b.
func difference(a, b []string) []string {
	in := map[string]bool{}
	for _, s := range b {
		in[s] = true
	}
	var out []string
	for _, s := range a {
		if !in[s] {
			out = append(out, s)
		}
	}
	return out
}
