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

	"sigs.k8s.io/yaml"

	"github.com/gpumem/gpumem_exporter/internal/dashboardtest"
	"github.com/gpumem/gpumem_exporter/internal/doccheck"
)

const (
	metricsDoc = "../docs/metrics.md"
	rulesFile  = "../deploy/prometheus/rules.yml"
	// fleet.json reads the fleet recording rules, loaded beside rules.yml.
	fleetRulesFile = "../deploy/prometheus/fleet-rules.yml"
	datasourceUID  = "${datasource}"
)

// wantDashboards are the dashboards the project ships, by file and uid.
var wantDashboards = map[string]string{
	"fleet.json":    "gpumem-fleet",
	"node.json":     "gpumem-node",
	"workload.json": "gpumem-workload",
}

// commonVariables are the variables every dashboard has: the data source,
// the scrape job (cluster), the node (instance), the GPU, the namespace and
// the pod.
var commonVariables = []string{"datasource", "job", "instance", "gpu", "namespace", "pod"}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type link struct {
	Title string `json:"title"`
	URL   string `json:"url"`
}

type panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	Datasource  *datasource `json:"datasource"`
	GridPos     struct {
		X, Y, W, H int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Links []link `json:"links"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row's panels
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasource     `json:"datasource"`
	AllValue   string          `json:"allValue"`
	IncludeAll bool            `json:"includeAll"`
}

type annotation struct {
	Name       string      `json:"name"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type dashboard struct {
	file          string
	SchemaVersion int      `json:"schemaVersion"`
	UID           string   `json:"uid"`
	Title         string   `json:"title"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Panels        []panel  `json:"panels"`
	Links         []struct {
		Type string   `json:"type"`
		Tags []string `json:"tags"`
	} `json:"links"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []annotation `json:"list"`
	} `json:"annotations"`
}

// loadDashboards returns every *.json of this folder, parsed.
func loadDashboards(t *testing.T) []dashboard {
	t.Helper()
	files, err := filepath.Glob("*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards here (%v)", err)
	}
	var out []dashboard
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := dashboard{file: f}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s does not parse: %v", f, err)
		}
		out = append(out, d)
	}
	return out
}

// forEach runs check on each dashboard, as a subtest named after its file.
func forEach(t *testing.T, check func(t *testing.T, d dashboard)) {
	t.Helper()
	for _, d := range loadDashboards(t) {
		t.Run(d.file, func(t *testing.T) { check(t, d) })
	}
}

// allPanels returns the dashboard's panels, rows' nested panels included.
func allPanels(d dashboard) []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

func variables(d dashboard) map[string]variable {
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	return vars
}

// query is one PromQL expression of a dashboard and where it is.
type query struct {
	where string
	expr  string
}

// queries returns every PromQL expression in the dashboard: the panels'
// targets, the annotations and the selectors inside the variables'
// label_values() queries.
func queries(t *testing.T, d dashboard) []query {
	t.Helper()
	var qs []query
	for _, p := range allPanels(d) {
		for _, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("%s panel %d (%q) target %s", d.file, p.ID, p.Title, tg.RefID), tg.Expr})
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			qs = append(qs, query{fmt.Sprintf("%s annotation %q", d.file, a.Name), a.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		selector, _, err := dashboardtest.LabelValues(v.Query)
		if err != nil {
			t.Fatalf("%s variable %s: %v", d.file, v.Name, err)
		}
		qs = append(qs, query{fmt.Sprintf("%s variable %s", d.file, v.Name), selector})
	}
	return qs
}

func TestTheThreeDashboardsExist(t *testing.T) {
	t.Parallel()
	uids := map[string]string{}
	for _, d := range loadDashboards(t) {
		if other, ok := uids[d.UID]; ok {
			t.Errorf("%s and %s share uid %q: Grafana would keep one of them", other, d.file, d.UID)
		}
		uids[d.UID] = d.file
		if want, ok := wantDashboards[d.file]; ok && d.UID != want {
			t.Errorf("%s: uid %q, want %q (links between the dashboards use it)", d.file, d.UID, want)
		}
	}
	for file := range wantDashboards {
		if _, err := os.Stat(file); err != nil {
			t.Errorf("no dashboard %s: %v", file, err)
		}
	}
}

func TestDashboardParses(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, d dashboard) {
		if d.SchemaVersion != 39 {
			t.Errorf("schemaVersion = %d, want 39", d.SchemaVersion)
		}
		if d.UID == "" {
			t.Error("the dashboard has no uid: links to it would break on every import")
		}
		if d.Title == "" || d.Description == "" {
			t.Error("the dashboard needs a title and a description")
		}
		if len(d.Panels) == 0 {
			t.Error("the dashboard has no panels")
		}
	})
}

// The dashboards find each other by their tag: a "dashboards" link on tag
// gpumem in each.
func TestDashboardsLinkToEachOther(t *testing.T) {
	t.Parallel()
	uids := map[string]bool{}
	for _, d := range loadDashboards(t) {
		uids[d.UID] = true
	}
	forEach(t, func(t *testing.T, d dashboard) {
		if !contains(d.Tags, "gpumem") {
			t.Errorf("tags %v lack gpumem", d.Tags)
		}
		linked := false
		for _, l := range d.Links {
			linked = linked || (l.Type == "dashboards" && contains(l.Tags, "gpumem"))
		}
		if !linked {
			t.Error("no link to the dashboards tagged gpumem")
		}
		// Data links to another dashboard name an existing uid.
		for _, p := range allPanels(d) {
			for _, l := range p.FieldConfig.Defaults.Links {
				m := regexp.MustCompile(`^/d/([^/?]+)`).FindStringSubmatch(l.URL)
				if m != nil && !uids[m[1]] {
					t.Errorf("panel %d (%q): link %q points at uid %s, which no dashboard has", p.ID, p.Title, l.URL, m[1])
				}
			}
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestPanelIDsAreUnique(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, d dashboard) {
		seen := map[int]string{}
		for _, p := range allPanels(d) {
			if p.ID == 0 {
				t.Errorf("panel %q has no id", p.Title)
				continue
			}
			if other, ok := seen[p.ID]; ok {
				t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
			}
			seen[p.ID] = p.Title
		}
	})
}

func TestPanelsFitTheGrid(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, d dashboard) {
		for _, p := range allPanels(d) {
			g := p.GridPos
			if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("panel %d (%q): gridPos %+v is outside the 24-column grid", p.ID, p.Title, g)
			}
			if p.Type != "row" && p.Description == "" {
				t.Errorf("panel %d (%q) has no description: say what it shows in the memory model's words", p.ID, p.Title)
			}
		}
	})
}

func TestEveryQueryUsesTheDatasourceVariable(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, d dashboard) {
		check := func(where string, ds *datasource) {
			if ds == nil || ds.UID != datasourceUID {
				t.Errorf("%s: datasource %+v, want uid %q", where, ds, datasourceUID)
			} else if ds.Type != "prometheus" {
				t.Errorf("%s: datasource type %q, want prometheus", where, ds.Type)
			}
		}
		for _, p := range allPanels(d) {
			where := fmt.Sprintf("panel %d (%q)", p.ID, p.Title)
			if p.Type != "row" {
				check(where, p.Datasource)
			}
			for _, tg := range p.Targets {
				check(where+" target "+tg.RefID, tg.Datasource)
			}
		}
		for _, a := range d.Annotations.List {
			if a.Expr != "" {
				check(fmt.Sprintf("annotation %q", a.Name), a.Datasource)
			}
		}
		for _, v := range d.Templating.List {
			if v.Type == "query" {
				check("variable "+v.Name, v.Datasource)
			}
		}
	})
}

func TestTemplateVariables(t *testing.T) {
	t.Parallel()
	// Each variable's query narrows by the variables before it, so that a
	// node's list shows only that job's nodes, and so on.
	chained := map[string][]string{
		"instance":  {"$job"},
		"gpu":       {"$job", "$instance"},
		"namespace": {"$job", "$instance"},
		"pod":       {"$job", "$instance", "$namespace"},
		"workload":  {"$job", "$instance", "$namespace", "$pod"},
	}
	forEach(t, func(t *testing.T, d dashboard) {
		vars := variables(d)
		for i, name := range commonVariables {
			if i >= len(d.Templating.List) || d.Templating.List[i].Name != name {
				t.Errorf("variable %d is not %s: the drop-downs go %v", i, name, commonVariables)
				break
			}
		}
		ds, ok := vars["datasource"]
		if !ok || ds.Type != "datasource" || string(ds.Query) != `"prometheus"` {
			t.Errorf("want a variable datasource of type datasource for prometheus, got %+v (query %s)", ds, ds.Query)
		}
		for _, name := range commonVariables[1:] {
			v, ok := vars[name]
			if !ok {
				t.Errorf("no variable %s", name)
				continue
			}
			for _, dep := range chained[name] {
				if d.file == "fleet.json" && dep == "$instance" && (name == "namespace" || name == "pod") {
					continue // the fleet's workload rules sum nodes away
				}
				if !strings.Contains(string(v.Query), dep) {
					t.Errorf("variable %s: query %s does not narrow by %s", name, v.Query, dep)
				}
			}
		}
		// The fleet's lists come from the fleet recording rules, which a
		// global view over shards (docs/scaling.md) also has; the others
		// from the GPUs' own series.
		for _, name := range []string{"job", "instance", "gpu"} {
			want := "gpumem_gpu_info"
			if d.file == "fleet.json" {
				want = map[string]string{"job": "instance:gpumem_gpus:count", "instance": "instance:gpumem_gpus:count", "gpu": "gpu:gpumem_memory_used:ratio"}[name]
			}
			if v := vars[name]; !strings.Contains(string(v.Query), want) {
				t.Errorf("variable %s: query %s, want label_values of %s", name, v.Query, want)
			}
		}
		if d.file == "fleet.json" {
			for _, name := range []string{"namespace", "pod"} {
				if v := vars[name]; !strings.Contains(string(v.Query), "workload:") {
					t.Errorf("variable %s: query %s, want label_values of a workload: rule of fleet-rules.yml", name, v.Query)
				}
			}
		}
		// Processes outside Kubernetes have an empty namespace and pod: All
		// must be .*, not the list of values, or they would be left out.
		for _, name := range []string{"namespace", "pod"} {
			if v := vars[name]; !v.IncludeAll || v.AllValue != ".*" {
				t.Errorf("variable %s: includeAll %v, allValue %q; want All as .*, which keeps processes outside Kubernetes", name, v.IncludeAll, v.AllValue)
			}
		}
	})
	for _, d := range loadDashboards(t) {
		if d.file == "workload.json" {
			if _, ok := variables(d)["workload"]; !ok {
				t.Error("workload.json has no variable workload: one pod, Slurm job or process")
			}
		}
	}
}

// TestVariablesAreUsed: a variable no query uses filters nothing, and a
// user who picks a pod would get every pod.
func TestVariablesAreUsed(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, d dashboard) {
		var all strings.Builder
		for _, p := range allPanels(d) {
			for _, tg := range p.Targets {
				all.WriteString(tg.Expr)
			}
		}
		for name := range variables(d) {
			if name == "datasource" {
				continue
			}
			if !strings.Contains(all.String(), "$"+name) && !strings.Contains(all.String(), "${"+name) {
				t.Errorf("no panel uses variable %s", name)
			}
		}
	})
}

// IEC units only: GPU memory comes in GiB, and "decbytes" would print 150 GB
// for an H200's 140 GiB.
func TestByteUnitsAreIEC(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, d dashboard) {
		b, err := os.ReadFile(d.file)
		if err != nil {
			t.Fatal(err)
		}
		if m := regexp.MustCompile(`"unit":\s*"(dec[a-z]*bytes)"`).FindSubmatch(b); m != nil {
			t.Errorf("unit %s is SI; use bytes (IEC)", m[1])
		}
	})
}

// grafanaVariable matches $name, ${name}, ${name:format} and [[name]].
var grafanaVariable = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// builtins are Grafana's interval variables, replaced by a typical value.
var builtins = map[string]string{
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__range":         "1h",
}

// substitute replaces Grafana variables in expr as Grafana would: interval
// variables by a duration, the dashboard's own variables by the regex .*.
// An unknown variable is an error.
func substitute(expr string, dashboardVars map[string]variable) (string, error) {
	var unknown []string
	out := grafanaVariable.ReplaceAllStringFunc(expr, func(s string) string {
		m := grafanaVariable.FindStringSubmatch(s)
		name := m[1] + m[2] + m[3]
		if v, ok := builtins[name]; ok {
			return v
		}
		if _, ok := dashboardVars[name]; ok {
			return ".*"
		}
		unknown = append(unknown, s)
		return s
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown variables %s", strings.Join(unknown, ", "))
	}
	return out, nil
}

func TestSubstitute(t *testing.T) {
	t.Parallel()
	vars := map[string]variable{"instance": {}, "gpu": {}}
	for _, tc := range []struct{ in, want string }{
		{`rate(x{instance="$instance"}[$__rate_interval])`, `rate(x{instance=".*"}[5m])`},
		{`x{gpu=~"${gpu}", g=~"${gpu:regex}", h=~"[[gpu]]"}[$__interval]`, `x{gpu=~".*", g=~".*", h=~".*"}[1m]`},
		{`increase(x[$__range])`, `increase(x[1h])`},
	} {
		got, err := substitute(tc.in, vars)
		if err != nil || got != tc.want {
			t.Errorf("substitute(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := substitute(`x{pod="$nope"}`, vars); err == nil {
		t.Error("substitute accepted $nope, which the dashboard does not define")
	}
}

// TestQueriesAreValidPromQL writes every query, its variables substituted,
// as a recording rule and has promtool check the file: one group per query,
// named after where the query is, so that an error says which one.
func TestQueriesAreValidPromQL(t *testing.T) {
	t.Parallel()
	bin := doccheck.Promtool(t)
	var b strings.Builder
	b.WriteString("groups:\n")
	n := 0
	for _, d := range loadDashboards(t) {
		vars := variables(d)
		for _, q := range queries(t, d) {
			expr, err := substitute(q.expr, vars)
			if err != nil {
				t.Errorf("%s: %v", q.where, err)
				continue
			}
			name, _ := json.Marshal(q.where)
			body, _ := json.Marshal(expr) // a JSON string is a YAML double-quoted scalar
			fmt.Fprintf(&b, "  - name: %s\n    rules:\n      - record: dashboard_query_%d\n        expr: %s\n", name, n, body)
			n++
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard_queries.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboards' %d queries: %v\n%s", n, err, out)
	}
}

func TestQueriesUseOnlyDocumentedMetrics(t *testing.T) {
	t.Parallel()
	documented := doccheck.DocumentedMetrics(t, metricsDoc)
	forEach(t, func(t *testing.T, d dashboard) {
		missing := map[string][]string{}
		used := 0
		for _, q := range queries(t, d) {
			used += len(doccheck.MetricNames(q.expr))
			for _, name := range doccheck.Undocumented(q.expr, documented) {
				missing[name] = append(missing[name], q.where)
			}
		}
		if used == 0 {
			t.Fatal("no gpumem_ metric found in the dashboard's queries")
		}
		names := make([]string, 0, len(missing))
		for name := range missing {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			t.Errorf("%s is not documented in %s (used in %s)", name, metricsDoc, strings.Join(missing[name], "; "))
		}
	})
}

// rules returns the recording rules' and the alerts' names in rules.yml.
func rules(t *testing.T) (records, alerts map[string]bool) {
	t.Helper()
	records, alerts = map[string]bool{}, map[string]bool{}
	for _, file := range []string{rulesFile, fleetRulesFile} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			Groups []struct {
				Rules []struct {
					Record string `json:"record"`
					Alert  string `json:"alert"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(b, &f); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				if r.Record != "" {
					records[r.Record] = true
				}
				if r.Alert != "" {
					alerts[r.Alert] = true
				}
			}
		}
	}
	return records, alerts
}

var (
	// ruleName matches a recording rule's name (level:metric:operations).
	ruleName = regexp.MustCompile(`\b[a-z_]+:[a-z0-9_]+(?::[a-z0-9_]+)?\b`)
	// alertName matches the name of one of rules.yml's alerts in a text.
	alertName = regexp.MustCompile(`\bGPU(?:Workload|Memory|MemExporter|Process)[A-Za-z]+\b`)
)

// TestRulesTheDashboardsNeedExist: the panels read recording rules of
// deploy/prometheus/rules.yml and fleet-rules.yml and name rules.yml's
// alerts in their descriptions;
// a rule renamed there would leave a panel empty.
func TestRulesTheDashboardsNeedExist(t *testing.T) {
	t.Parallel()
	records, alerts := rules(t)
	forEach(t, func(t *testing.T, d dashboard) {
		for _, q := range queries(t, d) {
			expr, err := substitute(q.expr, variables(d)) // ${workload:regex} is no rule
			if err != nil {
				t.Fatalf("%s: %v", q.where, err)
			}
			for _, name := range ruleName.FindAllString(expr, -1) {
				if !records[name] {
					t.Errorf("%s: recording rule %s is in neither %s nor %s", q.where, name, rulesFile, fleetRulesFile)
				}
			}
		}
		texts := []string{d.Description}
		for _, p := range allPanels(d) {
			texts = append(texts, p.Description)
		}
		for _, text := range texts {
			for _, name := range alertName.FindAllString(text, -1) {
				if !alerts[name] {
					t.Errorf("a description names alert %s, which %s does not have", name, rulesFile)
				}
			}
		}
	})
}
