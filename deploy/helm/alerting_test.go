package helm

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck"
	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck/manifestchecktest"
	"sigs.k8s.io/yaml"
)

const (
	alertmanagerExample = "../alertmanager/alertmanager.yml"
	// defaultRunbookBase is the base of runbook_url in rules.yml.
	defaultRunbookBase = "https://github.com/gpumem/gpumem_exporter/blob/main/docs/alerts.md"
)

// exampleConfig is what the test reads of deploy/alertmanager/alertmanager.yml.
type exampleConfig struct {
	Route struct {
		GroupBy []string `json:"group_by"`
	} `json:"route"`
	InhibitRules []struct {
		SourceMatchers []string `json:"source_matchers"`
		TargetMatchers []string `json:"target_matchers"`
		Equal          []string `json:"equal"`
	} `json:"inhibit_rules"`
}

// matchers turns Alertmanager's matcher strings (name=~"value") into the
// AlertmanagerConfig's form.
func matchers(t *testing.T, in []string) []manifestcheck.Matcher {
	t.Helper()
	var out []manifestcheck.Matcher
	for _, s := range in {
		i := strings.IndexAny(s, "=!")
		if i < 0 {
			t.Fatalf("matcher %q has no operator", s)
		}
		name, rest := s[:i], s[i:]
		var op string
		for _, o := range []string{"=~", "!~", "!=", "="} {
			if strings.HasPrefix(rest, o) {
				op = o
				break
			}
		}
		out = append(out, manifestcheck.Matcher{Name: name, MatchType: op, Value: strings.Trim(rest[len(op):], `"`)})
	}
	return out
}

// TestAlertmanagerConfigKeepsTheExamplesInhibitions: the chart's
// AlertmanagerConfig (alertmanagerConfig.enabled) inhibits and groups as
// deploy/alertmanager/alertmanager.yml does, sends to the receiver the
// values give, and keeps the routes the values add.
func TestAlertmanagerConfigKeepsTheExamplesInhibitions(t *testing.T) {
	var ex exampleConfig
	if err := yaml.Unmarshal([]byte(readText(t, alertmanagerExample)), &ex); err != nil {
		t.Fatal(err)
	}
	objs, _ := mustRender(t, "alerting.yaml", releaseName, namespace)
	amc := manifestchecktest.One[manifestcheck.AlertmanagerConfig](t, objs)
	if amc.Labels["alertmanagerConfig"] != "gpu" {
		t.Errorf("AlertmanagerConfig labels %v lack additionalLabels alertmanagerConfig=gpu", amc.Labels)
	}
	if len(amc.Spec.InhibitRules) != len(ex.InhibitRules) {
		t.Fatalf("%d inhibit rules, want the %d of %s", len(amc.Spec.InhibitRules), len(ex.InhibitRules), alertmanagerExample)
	}
	for i, want := range ex.InhibitRules {
		got := amc.Spec.InhibitRules[i]
		if !reflect.DeepEqual(got.SourceMatch, matchers(t, want.SourceMatchers)) || !reflect.DeepEqual(got.TargetMatch, matchers(t, want.TargetMatchers)) || !reflect.DeepEqual(got.Equal, want.Equal) {
			t.Errorf("inhibit rule %d: %+v, want the example's %+v", i, got, want)
		}
	}
	route := amc.Spec.Route
	if route == nil {
		t.Fatal("AlertmanagerConfig without a route")
	}
	if want := []string{"cluster", "region", "alertname", "namespace", "workload", "instance"}; !reflect.DeepEqual(route.GroupBy, want) {
		t.Errorf("groupBy %v, want the values' %v", route.GroupBy, want)
	}
	for _, l := range ex.Route.GroupBy {
		found := false
		for _, g := range route.GroupBy {
			found = found || g == l
		}
		if !found {
			t.Errorf("groupBy %v lacks %s, which the example groups by", route.GroupBy, l)
		}
	}
	if len(route.Routes) != 1 || route.Routes[0].Receiver != "ml-pager" {
		t.Errorf("routes %+v, want the values' route to ml-pager", route.Routes)
	}
	names := map[string]map[string]any{}
	for _, r := range amc.Spec.Receivers {
		name, _ := r["name"].(string)
		names[name] = r
	}
	if r := names[route.Receiver]; r == nil || r["webhookConfigs"] == nil {
		t.Errorf("the route's receiver %q is not defined with the values' webhookConfigs: %v", route.Receiver, amc.Spec.Receivers)
	}
	if names["ml-pager"] == nil {
		t.Errorf("receiver ml-pager of the values missing: %v", amc.Spec.Receivers)
	}
}

// TestRunbookBaseURL: prometheusRule.runbookBaseURL moves every alert's
// runbook_url, and nothing else of the rules.
func TestRunbookBaseURL(t *testing.T) {
	objs, _ := mustRender(t, "runbook.yaml", releaseName, namespace)
	rules, _, err := manifestcheck.Rules(objs)
	if err != nil || rules == nil {
		t.Fatalf("no PrometheusRule of rules.yml (%v)", err)
	}
	want, err := manifestcheck.ReadRules(rulesSource)
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for g := range rules.Spec.Groups {
		for r, rule := range rules.Spec.Groups[g].Rules {
			if rule.Alert == "" {
				continue
			}
			alerts++
			if got, w := rule.Annotations["runbook_url"], "https://wiki.example.com/gpu/alerts#"+strings.ToLower(rule.Alert); got != w {
				t.Errorf("alert %s: runbook_url %q, want %q", rule.Alert, got, w)
			}
			rule.Annotations["runbook_url"] = strings.Replace(rule.Annotations["runbook_url"], "https://wiki.example.com/gpu/alerts", defaultRunbookBase, 1)
			rules.Spec.Groups[g].Rules[r] = rule
		}
	}
	if alerts == 0 {
		t.Fatal("no alerts in the PrometheusRule")
	}
	if !reflect.DeepEqual(rules.Spec, want) {
		t.Errorf("with runbookBaseURL, the rules differ from %s in more than runbook_url: %s", rulesSource, firstDiff(rules.Spec, want))
	}
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
