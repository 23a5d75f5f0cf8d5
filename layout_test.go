package main

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/gpumem/gpumem_exporter/"

// layers places every package of the module. The data flow is sources ->
// one join -> readers -> outputs -> main; a package imports only lower
// layers (internal/ aside). A package missing here fails the test.
var layers = map[string]int{
	// Vocabulary and libraries the flow uses, which import no product
	// package: the wire protocol, the verdicts and forecasts, the text
	// exposition format, the simulated node's script.
	"allocstats/wire": 1, "diagnosis": 1, "exposition": 1, "simulate/scenario": 1,
	// Sources.
	"nvmlpoll": 2, "allocstats": 2, "workload": 2, "csi": 2,
	"workload/pods": 3, "simulate": 3,
	// The store's clients, for the tests of the packages that read it.
	"allocstats/allocstatstest": 3,
	// The one join.
	"attribution": 4,
	// Its readers.
	"collector": 5, "oom": 5, "foresight": 5,
	// Outputs of the readers: the Events of the OOM reports, the landing page.
	"oom/kubeevents": 6, "landing": 6,
	// The binaries.
	"": 7, "cmd/gpumem-csi": 7,
	// What tests the whole from outside: end to end, the attacks, the
	// dashboards. (The deployment's tests are a module of their own,
	// deploy/go.mod, which imports this one.)
	"e2e": 8, "attack": 8, "dashboards": 8,
}

// infrastructure are the internal packages: below every layer, they import
// no product package and take plain values (logging, the file descriptor
// budget, listeners, the flags' defaults, saturating sums, test helpers).
var infrastructure = map[string]bool{
	"internal/alertmanagertest": true, "internal/authguard": true, "internal/dashboardtest": true, "internal/connshed": true, "internal/defaults": true,
	"internal/doccheck": true, "internal/exportertest": true, "internal/fdbudget": true, "internal/fieldtest": true,
	"internal/logging": true, "internal/memtrim": true, "internal/mocknode": true, "internal/procfixture": true,
	"internal/ratelog": true, "internal/safetext": true, "internal/satmath": true, "internal/tick": true,
}

// sources never import one another: they meet only in attribution (the
// pod watch extends workload, whose lookup it serves).
var sourcePackages = map[string]bool{"nvmlpoll": true, "allocstats": true, "workload": true, "workload/pods": true, "csi": true}

// layoutViolation says what is wrong with pkg importing dep; "" if nothing.
func layoutViolation(pkg, dep string) string {
	from, known := layers[pkg]
	switch {
	case infrastructure[pkg] && infrastructure[dep]:
		return ""
	case infrastructure[pkg]:
		return "infrastructure package " + pkg + " imports " + dep + ": internal packages take plain values"
	case infrastructure[dep]:
		return ""
	case !known:
		return "package " + pkg + " has no layer in this test: add it"
	}
	to, known := layers[dep]
	switch {
	case !known:
		return "package " + dep + " (imported by " + pkg + ") has no layer in this test: add it"
	case sourcePackages[pkg] && sourcePackages[dep] && !(pkg == "workload/pods" && dep == "workload"):
		return "source " + pkg + " imports source " + dep + ": sources meet only in attribution"
	case to >= from:
		return pkg + " imports " + dep + ": imports must point down the data flow"
	}
	return ""
}

func TestLayersPlaceEveryPackageAndImportsFollowTheDataFlow(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(f[0], strings.TrimSuffix(module, "/")), "/")
		if _, known := layers[pkg]; !known && !infrastructure[pkg] {
			t.Errorf("package %q has no layer in this test: add it", pkg)
			continue
		}
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			if why := layoutViolation(pkg, strings.TrimPrefix(imp, module)); why != "" {
				t.Error(why)
			}
		}
	}
}

// The product module's go.mod names only what the binaries import:
// gpumem_exporter (this package) and gpumem-csi (cmd/...). Whatever only
// the deployment's tests need (the Helm SDK, kustomize, csi-test) belongs
// in deploy/go.mod, a module of its own, so that whoever vendors, scans or
// builds the exporter does not carry it.
func TestGoModRequiresOnlyWhatTheBinariesImport(t *testing.T) {
	t.Parallel()
	goList := func(args ...string) []string {
		t.Helper()
		cmd := exec.Command("go", append([]string{"list"}, args...)...)
		cmd.Env = append(cmd.Environ(), "GOWORK=off") // this module's go.mod alone
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
		}
		return strings.Fields(string(out))
	}
	imported := map[string]bool{}
	for _, m := range goList("-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".", "./cmd/...") {
		imported[m] = true
	}
	direct := goList("-m", "-f", "{{if not (or .Main .Indirect)}}{{.Path}}{{end}}", "all")
	if len(direct) == 0 {
		t.Fatal("go list -m found no direct requirement in go.mod")
	}
	for _, m := range direct {
		if !imported[m] {
			t.Errorf("go.mod requires %s, which neither gpumem_exporter nor gpumem-csi imports: if only tests use it, move them to the deploy module (deploy/go.mod), then go mod tidy", m)
		}
	}
}

// The rule itself: an import up the flow, between sources, out of
// infrastructure or of an unplaced package fails.
func TestLayoutRefusesImportsAgainstTheFlow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pkg, dep string
		ok       bool
	}{
		{"oom", "attribution", true},
		{"oom/kubeevents", "oom", true},
		{"", "oom/kubeevents", true},
		{"collector", "internal/ratelog", true},
		{"attribution", "oom", false},
		{"oom", "oom/kubeevents", false},
		{"diagnosis", "attribution", false},
		{"foresight", "oom", false},
		{"nvmlpoll", "allocstats", false},
		{"internal/tick", "nvmlpoll", false},
		{"newpackage", "allocstats", false},
		{"oom", "newpackage", false},
	} {
		if got := layoutViolation(tc.pkg, tc.dep); (got == "") != tc.ok {
			t.Errorf("%q importing %q: violation %q, want allowed=%v", tc.pkg, tc.dep, got, tc.ok)
		}
	}
}
