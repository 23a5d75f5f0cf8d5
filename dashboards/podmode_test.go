package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/doccheck"
)

// podModeWorkload is the workload the workload dashboard shows in
// TestQueriesKeepContainersApartInPodMode.
const podModeWorkload = "ml/a-0"

// podModeContainers are the containers of two pods that share GPU 0 of
// node-a, as --collector.process.aggregate=pod exports them: pid and comm
// empty, one series per container and GPU.
var podModeContainers = []struct{ pod, container string }{
	{"a-0", "trainer-a"},
	{"b-0", "trainer-b"},
}

// metricInQuery matches a metric name in a query, not the middle of a
// recording rule's name (process:gpumem_…:…).
var metricInQuery = regexp.MustCompile(`(?:^|[^:\w])(gpumem_\w+)`)

// podModeSeries returns promtool input series for every metric the
// queries read: per-process families once per container of
// podModeContainers, with the workload label the exporter gives them, the
// others once for GPU 0. Counters climb by one a
// minute, so that every OOM and retry panel has rows.
func podModeSeries(exprs []string) string {
	metrics := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricInQuery.FindAllStringSubmatch(e, -1) {
			metrics[m[1]] = true
		}
	}
	names := make([]string, 0, len(metrics))
	for m := range metrics {
		names = append(names, m)
	}
	sort.Strings(names)
	const gpu = `instance="node-a:9481",job="gpumem",gpu="0",uuid="GPU-0000"`
	var b strings.Builder
	add := func(name, labels string) {
		values := "1073741824x150"
		if strings.HasSuffix(name, "_total") {
			values = "0+1x150"
		}
		if strings.HasSuffix(name, "_bucket") {
			labels += `,le="+Inf"`
		}
		fmt.Fprintf(&b, "      - series: '%s{%s}'\n        values: '%s'\n", name, labels, values)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "gpumem_process_") && !strings.HasPrefix(name, "gpumem_allocator_") {
			add(name, gpu)
			continue
		}
		for _, c := range podModeContainers {
			labels := fmt.Sprintf(`%s,pid="",comm="",namespace="ml",pod=%q,container=%q`, gpu, c.pod, c.container)
			if name != "gpumem_allocator_last_oom_info" {
				labels += fmt.Sprintf(`,workload="ml/%s"`, c.pod)
			}
			add(name, labels)
		}
	}
	return b.String()
}

// writeQueryRules writes exprs as recording rules named prefix_0, prefix_1…
// (one group each, named after where the query is) and returns the file.
func writeQueryRules(t *testing.T, dir, prefix string, qs []query, exprs []string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("groups:\n")
	for i, e := range exprs {
		name, _ := json.Marshal(qs[i].where)
		body, _ := json.Marshal(e) // a JSON string is a YAML double-quoted scalar
		fmt.Fprintf(&b, "  - name: %s\n    interval: 1m\n    rules:\n      - record: %s_%d\n        expr: %s\n", name, prefix, i, body)
	}
	path := filepath.Join(dir, prefix+".yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestQueriesKeepContainersApartInPodMode evaluates every query of the
// dashboards, and rules.yml, with promtool over two containers of two pods
// that share a GPU in pod mode (pid=""): no query may fail (a join on pid
// alone fails there with "many-to-many matching"), and the workload
// dashboard, showing one of the pods, may show no row of the other; rows
// that name a workload name the container's own.
func TestQueriesKeepContainersApartInPodMode(t *testing.T) {
	t.Parallel()
	bin := doccheck.Promtool(t)
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()

	var allQueries, workloadQueries []query
	var allExprs, workloadExprs []string
	for _, d := range loadDashboards(t) {
		vars := variables(d)
		for _, q := range queries(t, d) {
			expr, err := substitute(q.expr, vars)
			if err != nil {
				t.Fatalf("%s: %v", q.where, err)
			}
			allQueries, allExprs = append(allQueries, q), append(allExprs, expr)
			if d.file != "workload.json" || !strings.Contains(q.expr, "${workload:regex}") {
				continue
			}
			expr, err = substitute(strings.ReplaceAll(q.expr, "${workload:regex}", podModeWorkload), vars)
			if err != nil {
				t.Fatalf("%s: %v", q.where, err)
			}
			workloadQueries, workloadExprs = append(workloadQueries, q), append(workloadExprs, expr)
		}
	}
	if len(workloadExprs) == 0 {
		t.Fatal("found no query of workload.json that reads ${workload:regex}")
	}

	test := fmt.Sprintf(`rule_files:
  - %s
  - %s
  - %s
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
%s    promql_expr_test:
      # Of the rows that name a container, only %s's.
      - expr: group by (container) ({__name__=~"workload_query_.*", container!=""})
        eval_time: 90m
        exp_samples:
          - labels: '{container="trainer-a"}'
            value: 1
      # Every row that names a container and a workload names its own pod.
      - expr: group by (container, workload) ({__name__=~"dashboard_query_.*", container!="", workload!=""})
        eval_time: 90m
        exp_samples:
          - labels: '{container="trainer-a", workload="ml/a-0"}'
            value: 1
          - labels: '{container="trainer-b", workload="ml/b-0"}'
            value: 1
`, rules, writeQueryRules(t, dir, "dashboard_query", allQueries, allExprs),
		writeQueryRules(t, dir, "workload_query", workloadQueries, workloadExprs),
		podModeSeries(allExprs), podModeWorkload)
	path := filepath.Join(dir, "podmode_test.yml")
	if err := os.WriteFile(path, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "test", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules on the dashboards' %d queries in pod mode: %v\n%s", len(allExprs), err, out)
	}
}
