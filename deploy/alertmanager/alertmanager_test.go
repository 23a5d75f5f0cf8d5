package alertmanager

import (
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/alertmanagertest"
	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

const (
	example = "alertmanager.yml"
	rules   = "../prometheus/rules.yml"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestExamplePassesAmtoolCheckConfig(t *testing.T) {
	out, err := exec.Command(alertmanagertest.Amtool(t), "check-config", example).CombinedOutput()
	if err != nil {
		t.Fatalf("amtool check-config %s: %v\n%s", example, err, out)
	}
}

// TestExampleRoutesByNamespaceAndSeverity: where each kind of alert goes.
func TestExampleRoutesByNamespaceAndSeverity(t *testing.T) {
	amtool := alertmanagertest.Amtool(t)
	for _, tc := range []struct {
		labels []string
		want   string
	}{
		{[]string{"alertname=GPUWorkloadMemoryLeak", "severity=warning", "namespace=ml", "workload=ml/train-0"}, "ml-team"},
		{[]string{"alertname=GPUWorkloadOOMRisk", "severity=critical", "namespace=research", "workload=research/x"}, "ml-team-pager"},
		{[]string{"alertname=GPUWorkloadOutOfMemory", "severity=warning", "workload=slurm job 4242", "slurm_job_id=4242"}, "gpu-oncall"},
		{[]string{"alertname=GPUMemExporterNVMLDown", "severity=critical", "instance=node-a:9481"}, "gpu-oncall-pager"},
		{[]string{"alertname=GPUWorkloadIdleCache", "severity=info", "namespace=serve", "workload=serve/llm-0"}, "gpu-tickets"},
	} {
		args := append([]string{"config", "routes", "test", "--config.file=" + example}, tc.labels...)
		out, err := exec.Command(amtool, args...).Output()
		if err != nil {
			t.Errorf("amtool %s: %v", strings.Join(args, " "), err)
			continue
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("%v goes to %q, want %q", tc.labels, got, tc.want)
		}
	}
}

var (
	quotedName = regexp.MustCompile(`alertname(?:=|=~|!=)"([^"]+)"`)
	ruleAlert  = regexp.MustCompile(`(?m)^\s*- alert: (\S+)\s*$`)
)

// TestExampleNamesOnlyAlertsOfTheRules: an alert renamed in rules.yml must
// not leave an inhibition that silently matches nothing.
func TestExampleNamesOnlyAlertsOfTheRules(t *testing.T) {
	known := map[string]bool{}
	for _, m := range ruleAlert.FindAllStringSubmatch(read(t, rules), -1) {
		known[m[1]] = true
	}
	for _, m := range quotedName.FindAllStringSubmatch(read(t, example), -1) {
		for _, name := range strings.Split(m[1], "|") {
			if !known[name] {
				t.Errorf("%s names alert %s, which %s does not have", example, name, rules)
			}
		}
	}
}

// TestExampleInhibitsInARealAlertmanager posts alerts as Prometheus does to
// an Alertmanager running the example, and reads back which ones it holds
// as suppressed.
func TestExampleInhibitsInARealAlertmanager(t *testing.T) {
	hook := alertmanagertest.NewWebhook(t)
	config := regexp.MustCompile(`http://alert-receiver\.example\.internal`).ReplaceAllString(read(t, example), hook.URL)
	am := alertmanagertest.Start(t, config)
	now := time.Now()
	alert := func(labels ...string) alertmanagertest.PostedAlert {
		l := map[string]string{}
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = v
		}
		return alertmanagertest.PostedAlert{Labels: l, StartsAt: now, EndsAt: now.Add(time.Hour)}
	}
	am.Post(t,
		alert("alertname=GPUWorkloadOutOfMemory", "severity=warning", "namespace=ml", "pod=a-0", "workload=ml/a-0", "cause=leak"),
		alert("alertname=GPUWorkloadMemoryLeak", "severity=warning", "namespace=ml", "pod=a-0", "workload=ml/a-0"),
		alert("alertname=GPUWorkloadOOMRisk", "severity=warning", "namespace=ml", "pod=a-0", "workload=ml/a-0"),
		alert("alertname=GPUWorkloadMemoryLeak", "severity=warning", "namespace=ml", "pod=b-0", "workload=ml/b-0"),
		alert("alertname=GPUWorkloadOOMRisk", "severity=warning", "workload=slurm job 7", "slurm_job_id=7"),
		// The same workload name in another cluster is another workload.
		alert("alertname=GPUWorkloadMemoryLeak", "severity=warning", "namespace=ml", "pod=a-0", "workload=ml/a-0", "cluster=west"),
		alert("alertname=GPUMemExporterNVMLDown", "severity=critical", "instance=node-a:9481", "job=gpumem"),
		alert("alertname=GPUMemExporterCollectorFailed", "severity=warning", "instance=node-a:9481", "job=gpumem", "collector=gpu"),
		alert("alertname=GPUMemoryFullSoon", "severity=warning", "instance=node-a:9481", "job=gpumem", "gpu=3"),
		alert("alertname=GPUMemExporterCollectorFailed", "severity=warning", "instance=node-b:9481", "job=gpumem", "collector=gpu"),
	)
	key := func(l map[string]string) string {
		var parts []string
		for _, k := range []string{"cluster", "alertname", "workload", "instance"} {
			if v := l[k]; v != "" {
				parts = append(parts, k+"="+v)
			}
		}
		return strings.Join(parts, ",")
	}
	want := map[string]string{
		"alertname=GPUWorkloadOutOfMemory,workload=ml/a-0":             "active",
		"alertname=GPUWorkloadMemoryLeak,workload=ml/a-0":              "suppressed",
		"alertname=GPUWorkloadOOMRisk,workload=ml/a-0":                 "suppressed",
		"alertname=GPUWorkloadMemoryLeak,workload=ml/b-0":              "active",
		"alertname=GPUWorkloadOOMRisk,workload=slurm job 7":            "active",
		"cluster=west,alertname=GPUWorkloadMemoryLeak,workload=ml/a-0": "active",
		"alertname=GPUMemExporterNVMLDown,instance=node-a:9481":        "active",
		"alertname=GPUMemExporterCollectorFailed,instance=node-a:9481": "suppressed",
		"alertname=GPUMemoryFullSoon,instance=node-a:9481":             "suppressed",
		"alertname=GPUMemExporterCollectorFailed,instance=node-b:9481": "active",
	}
	var got map[string]string
	// Alertmanager marks inhibitions when it evaluates them: poll until
	// every alert has left "unprocessed".
	ok := exportertest.Within(10*time.Second, func() bool {
		got = map[string]string{}
		for _, a := range am.Alerts(t) {
			got[key(a.Labels)] = a.Status.State
		}
		for k, w := range want {
			if got[k] != w {
				return false
			}
		}
		return true
	})
	if !ok {
		var lines []string
		for k, w := range want {
			if got[k] != w {
				lines = append(lines, k+": "+got[k]+", want "+w)
			}
		}
		sort.Strings(lines)
		t.Errorf("alert states in Alertmanager:\n  %s", strings.Join(lines, "\n  "))
	}
}
