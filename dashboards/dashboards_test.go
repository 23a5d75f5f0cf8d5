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

const (
	dashboardFile = "gpumem.json"
	metricsDoc    = "../docs/metrics.md"
	datasourceUID = "${datasource}"
)

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID      string      `json:"refId"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row's panels
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasource     `json:"datasource"`
}

type annotation struct {
	Name       string      `json:"name"`
	Expr       string      `json:"expr"`
	Datasource *datasource `json:"datasource"`
}

type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	UID           string  `json:"uid"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []annotation `json:"list"`
	} `json:"annotations"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s does not parse: %v", dashboardFile, err)
	}
	return d
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

// query is one PromQL expression of the dashboard and where it is.
type query struct {
	where string
	expr  string
}

// labelValues matches a label_values(selector, label) variable query.
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)

// queries returns every PromQL expression in the dashboard: the panels'
// targets, the annotations and the selectors inside the variables'
// label_values() queries.
func queries(t *testing.T, d dashboard) []query {
	t.Helper()
	var qs []query
	for _, p := range allPanels(d) {
		for _, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("panel %d (%q) target %s", p.ID, p.Title, tg.RefID), tg.Expr})
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			qs = append(qs, query{fmt.Sprintf("annotation %q", a.Name), a.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query is not a string: %s", v.Name, v.Query)
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Fatalf("variable %s: query %q is not label_values(selector, label)", v.Name, q)
		}
		qs = append(qs, query{fmt.Sprintf("variable %s", v.Name), m[1]})
	}
	return qs
}

func TestDashboardParses(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	if d.SchemaVersion != 39 {
		t.Errorf("schemaVersion = %d, want 39", d.SchemaVersion)
	}
	if d.UID == "" {
		t.Error("the dashboard has no uid: links to it would break on every import")
	}
	if len(d.Panels) == 0 {
		t.Error("the dashboard has no panels")
	}
}

func TestPanelIDsAreUnique(t *testing.T) {
	t.Parallel()
	seen := map[int]string{}
	for _, p := range allPanels(loadDashboard(t)) {
		if p.ID == 0 {
			t.Errorf("panel %q has no id", p.Title)
			continue
		}
		if other, ok := seen[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		seen[p.ID] = p.Title
	}
}

func TestPanelsFitTheGrid(t *testing.T) {
	t.Parallel()
	for _, p := range allPanels(loadDashboard(t)) {
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %d (%q): gridPos %+v is outside the 24-column grid", p.ID, p.Title, g)
		}
	}
}

func TestEveryQueryUsesTheDatasourceVariable(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	check := func(where string, ds *datasource) {
		if ds == nil || ds.UID != datasourceUID {
			t.Errorf("%s: datasource %+v, want uid %q", where, ds, datasourceUID)
		} else if ds.Type != "prometheus" {
			t.Errorf("%s: datasource type %q, want prometheus", where, ds.Type)
		}
	}
	for _, p := range allPanels(d) {
		where := fmt.Sprintf("panel %d (%q)", p.ID, p.Title)
		check(where, p.Datasource)
		for _, tg := range p.Targets {
			if tg.Datasource != nil {
				check(where+" target "+tg.RefID, tg.Datasource)
			}
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
}

func TestTemplateVariables(t *testing.T) {
	t.Parallel()
	vars := map[string]variable{}
	for _, v := range loadDashboard(t).Templating.List {
		vars[v.Name] = v
	}
	ds, ok := vars["datasource"]
	if !ok || ds.Type != "datasource" || string(ds.Query) != `"prometheus"` {
		t.Errorf("want a variable datasource of type datasource for prometheus, got %+v (query %s)", ds, ds.Query)
	}
	for _, name := range []string{"instance", "gpu"} {
		v, ok := vars[name]
		if !ok {
			t.Errorf("no variable %s", name)
			continue
		}
		if !strings.Contains(string(v.Query), "gpumem_gpu_info") {
			t.Errorf("variable %s: query %s, want label_values of gpumem_gpu_info", name, v.Query)
		}
	}
	if _, ok := vars["namespace"]; !ok {
		t.Error("no variable namespace")
	}
}

// IEC units only: GPU memory comes in GiB, and "decbytes" would print 150 GB
// for an H200's 140 GiB.
func TestByteUnitsAreIEC(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`"unit":\s*"(dec[a-z]*bytes)"`).FindSubmatch(b); m != nil {
		t.Errorf("unit %s is SI; use bytes (IEC)", m[1])
	}
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
func substitute(expr string, dashboardVars map[string]bool) (string, error) {
	var unknown []string
	out := grafanaVariable.ReplaceAllStringFunc(expr, func(s string) string {
		m := grafanaVariable.FindStringSubmatch(s)
		name := m[1] + m[2] + m[3]
		if v, ok := builtins[name]; ok {
			return v
		}
		if dashboardVars[name] {
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
	vars := map[string]bool{"instance": true, "gpu": true}
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
	if _, err := substitute(`x{pod="$pod"}`, vars); err == nil {
		t.Error("substitute accepted $pod, which the dashboard does not define")
	}
}

func dashboardVariables(d dashboard) map[string]bool {
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	return vars
}

// TestQueriesAreValidPromQL writes every query, its variables substituted,
// as a recording rule and has promtool check the file: one group per query,
// named after where the query is, so that an error says which one.
func TestQueriesAreValidPromQL(t *testing.T) {
	t.Parallel()
	bin := doccheck.Promtool(t)
	d := loadDashboard(t)
	vars := dashboardVariables(d)
	var b strings.Builder
	b.WriteString("groups:\n")
	qs := queries(t, d)
	for i, q := range qs {
		expr, err := substitute(q.expr, vars)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		name, _ := json.Marshal(q.where)
		body, _ := json.Marshal(expr) // a JSON string is a YAML double-quoted scalar
		fmt.Fprintf(&b, "  - name: %s\n    rules:\n      - record: dashboard_query_%d\n        expr: %s\n", name, i, body)
	}
	path := filepath.Join(t.TempDir(), "dashboard_queries.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's %d queries: %v\n%s", len(qs), err, out)
	}
}

func TestQueriesUseOnlyDocumentedMetrics(t *testing.T) {
	t.Parallel()
	documented := doccheck.DocumentedMetrics(t, metricsDoc)
	missing := map[string][]string{}
	used := 0
	for _, q := range queries(t, loadDashboard(t)) {
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
}
