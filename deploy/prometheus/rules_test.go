package prometheus

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/doccheck"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml from rules.yml")

const (
	rulesFile     = "rules.yml"
	rulesTestFile = "rules_test.yml"
	// rulesPodModeTestFile tests the rules with
	// --collector.process.aggregate=pod: containers sharing a GPU, pid="".
	rulesPodModeTestFile = "rules_podmode_test.yml"
	prometheusRuleFile   = "prometheusrule.yaml"
	metricsDoc           = "../../docs/metrics.md"
	alertsDoc            = "../../docs/alerts.md"
)

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(doccheck.Promtool(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestRulesPassPromtoolCheck(t *testing.T) {
	t.Parallel()
	runPromtool(t, "check", "rules", rulesFile)
}

func TestRulesPassTheirUnitTests(t *testing.T) {
	t.Parallel()
	runPromtool(t, "test", "rules", rulesTestFile)
}

func TestRulesPassTheirPodModeUnitTests(t *testing.T) {
	t.Parallel()
	runPromtool(t, "test", "rules", rulesPodModeTestFile)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// documentedMetrics returns the metrics docs/metrics.md lists, with their type.
func documentedMetrics(t *testing.T) map[string]string {
	return doccheck.DocumentedMetrics(t, metricsDoc)
}

// undocumented returns the gpumem_ metric names in text that docs/metrics.md
// does not list.
func undocumented(text string, documented map[string]string) []string {
	return doccheck.Undocumented(text, documented)
}

func TestRulesUseOnlyDocumentedMetrics(t *testing.T) {
	t.Parallel()
	if missing := undocumented(readFile(t, rulesFile), documentedMetrics(t)); len(missing) > 0 {
		t.Errorf("%s uses metrics that %s does not document: %s", rulesFile, metricsDoc, strings.Join(missing, ", "))
	}
}

var (
	alertName    = regexp.MustCompile(`(?m)^\s*- alert: (\S+)\s*$`)
	ruleStart    = regexp.MustCompile(`(?m)^\s*- (alert|record|name): `)
	silentCase   = regexp.MustCompile(`alertname: (\S+)\s*\n\s*exp_alerts: \[\]`)
	firingCase   = regexp.MustCompile(`alertname: (\S+)\s*\n\s*exp_alerts:\s*\n\s*- exp_labels:`)
	severityLine = regexp.MustCompile(`(?m)^\s*severity: (\S+)\s*$`)
)

// alertBodies returns the text of each alerting rule in rules.yml, by name.
func alertBodies(t *testing.T) map[string]string {
	t.Helper()
	text := readFile(t, rulesFile)
	starts := ruleStart.FindAllStringIndex(text, -1)
	bodies := map[string]string{}
	for i, s := range starts {
		end := len(text)
		if i+1 < len(starts) {
			end = starts[i+1][0]
		}
		body := text[s[0]:end]
		if m := alertName.FindStringSubmatch(body); m != nil {
			bodies[m[1]] = body
		}
	}
	if len(bodies) == 0 {
		t.Fatalf("no alerts found in %s", rulesFile)
	}
	return bodies
}

func TestEveryAlertHasSeverityAndAnnotations(t *testing.T) {
	t.Parallel()
	for name, body := range alertBodies(t) {
		m := severityLine.FindStringSubmatch(body)
		switch {
		case m == nil:
			t.Errorf("alert %s has no severity label", name)
		case m[1] != "critical" && m[1] != "warning" && m[1] != "info":
			t.Errorf("alert %s has severity %q, want critical, warning or info", name, m[1])
		}
		for _, key := range []string{"summary:", "description:"} {
			if !strings.Contains(body, key) {
				t.Errorf("alert %s has no %s annotation", name, strings.TrimSuffix(key, ":"))
			}
		}
	}
}

// runbookBase is the default base of every alert's runbook_url: docs/alerts.md
// as GitHub renders it. The chart's prometheusRule.runbookBaseURL replaces it.
const runbookBase = "https://github.com/gpumem/gpumem_exporter/blob/main/docs/alerts.md"

var (
	runbookLine = regexp.MustCompile(`(?m)^\s*runbook_url: (\S+)\s*$`)
	docHeading  = regexp.MustCompile(`(?m)^#{2,3} (\S+)\s*$`)
)

// TestEveryAlertHasARunbookURL: a notification carries a link a person can
// click (the Prometheus community's runbook_url), to the alert's own
// section of docs/alerts.md.
func TestEveryAlertHasARunbookURL(t *testing.T) {
	t.Parallel()
	anchors := map[string]bool{}
	for _, m := range docHeading.FindAllStringSubmatch(readFile(t, alertsDoc), -1) {
		anchors[strings.ToLower(m[1])] = true
	}
	for name, body := range alertBodies(t) {
		m := runbookLine.FindStringSubmatch(body)
		if m == nil {
			t.Errorf("alert %s has no runbook_url annotation", name)
			continue
		}
		if want := runbookBase + "#" + strings.ToLower(name); m[1] != want {
			t.Errorf("alert %s: runbook_url %s, want %s", name, m[1], want)
		}
		if !anchors[strings.ToLower(name)] {
			t.Errorf("alert %s: %s has no heading \"%s\" for its runbook_url to point at", name, alertsDoc, name)
		}
		if strings.Contains(body, "runbook:") {
			t.Errorf("alert %s still has a runbook annotation (a path, not a URL): use runbook_url", name)
		}
	}
}

func TestEveryAlertIsTestedFiringAndSilent(t *testing.T) {
	t.Parallel()
	tests := readFile(t, rulesTestFile)
	silent, firing := map[string]bool{}, map[string]bool{}
	for _, m := range silentCase.FindAllStringSubmatch(tests, -1) {
		silent[m[1]] = true
	}
	for _, m := range firingCase.FindAllStringSubmatch(tests, -1) {
		firing[m[1]] = true
	}
	for name := range alertBodies(t) {
		if !firing[name] {
			t.Errorf("%s has no case where %s fires", rulesTestFile, name)
		}
		if !silent[name] {
			t.Errorf("%s has no case where %s stays silent (exp_alerts: [])", rulesTestFile, name)
		}
	}
}

const prometheusRuleHeader = `# Generated from rules.yml by rules_test.go: do not edit. After changing
# rules.yml, run: go -C deploy test ./prometheus -run TestPrometheusRule -update
#
# The groups of rules.yml as a Prometheus Operator PrometheusRule. The
# Prometheus resource's ruleSelector must match its labels: add yours (for
# kube-prometheus-stack, release: <the Helm release's name>).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: gpumem-exporter
  labels:
    app.kubernetes.io/name: gpumem-exporter
    app.kubernetes.io/component: rules
spec:
`

// prometheusRule wraps rules.yml, less its leading comments, in a
// PrometheusRule: its groups, indented under spec.
func prometheusRule(rules string) string {
	var b strings.Builder
	b.WriteString(prometheusRuleHeader)
	lines := strings.SplitAfter(rules, "\n")
	i := 0
	for i < len(lines) && (strings.HasPrefix(lines[i], "#") || strings.TrimSpace(lines[i]) == "") {
		i++
	}
	for _, line := range lines[i:] {
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return b.String()
}

func TestPrometheusRuleMatchesRules(t *testing.T) {
	t.Parallel()
	want := prometheusRule(readFile(t, rulesFile))
	if *update {
		if err := os.WriteFile(prometheusRuleFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatalf("%v: generate it with: go -C deploy test ./prometheus -run TestPrometheusRule -update", err)
	}
	if !bytes.Equal(got, []byte(want)) {
		t.Errorf("%s differs from %s wrapped in a PrometheusRule; regenerate it with: go -C deploy test ./prometheus -run TestPrometheusRule -update", prometheusRuleFile, rulesFile)
	}
}

func TestUndocumentedReportsOnlyUnknownMetrics(t *testing.T) {
	t.Parallel()
	documented := map[string]string{
		"gpumem_nvml_up":                    "gauge",
		"gpumem_nvml_poll_duration_seconds": "histogram",
		"gpumem_gpu_memory_free_bytes":      "gauge",
	}
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"gpumem_nvml_up == 0", nil},
		{"rate(gpumem_nvml_poll_duration_seconds_bucket[5m])", nil},
		{"gpu:gpumem_memory_used:ratio > 0.95", nil},
		{"gpumem_exporter on {{ $labels.instance }}; gpumem_exporter: down", nil},
		{"gpumem_gpu_memory_free_bytes_bucket + gpumem_gpu_memory_fre_bytes", []string{"gpumem_gpu_memory_fre_bytes", "gpumem_gpu_memory_free_bytes_bucket"}},
	} {
		got := undocumented(tc.text, documented)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("undocumented(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

func TestDocumentedMetricsKnowsHistograms(t *testing.T) {
	t.Parallel()
	metrics := documentedMetrics(t)
	if got := metrics["gpumem_nvml_poll_duration_seconds"]; got != "histogram" {
		t.Errorf("type of gpumem_nvml_poll_duration_seconds read from %s = %q, want histogram", metricsDoc, got)
	}
}
