package main

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/gpumem/gpumem_exporter/"

// The data flow is sources -> one join -> readers -> main. A source never
// imports another source, and nothing imports upward. internal/ holds
// infrastructure (logging, the file descriptor budget, listeners, the
// flags' defaults, test helpers), below every layer: it imports no product
// package and takes plain values.
func TestPackagesFollowTheDataFlow(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	// Each package's layer; a package may import only lower layers (and
	// internal helpers, and its own subpackages' parent is not allowed).
	layer := map[string]int{
		"nvmlpoll": 1, "allocstats": 1, "workload": 1, "workload/pods": 2,
		"simulate": 2, "simulate/scenario": 0,
		"attribution": 3,
		"foresight":   4, "collector": 4, "oom": 4, "landing": 5,
		"workload/podevents": 5, // an output (Events on pods), beside the pod watch's client
		// The store's clients, for the tests of the packages that read it.
		"allocstats/allocstatstest": 2,
	}
	sources := map[string]bool{"nvmlpoll": true, "allocstats": true, "workload": true, "workload/pods": true}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		from, known := layer[pkg]
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if strings.HasPrefix(dep, "internal/") {
				continue
			}
			if strings.HasPrefix(pkg, "internal/") {
				t.Errorf("infrastructure package %s imports %s: internal packages take plain values", pkg, dep)
				continue
			}
			to, depKnown := layer[dep]
			switch {
			case !known && f[0] != strings.TrimSuffix(module, "/") && !strings.HasPrefix(pkg, "cmd/") && !strings.HasPrefix(pkg, "dashboards") && !strings.HasPrefix(pkg, "csi"):
				t.Errorf("package %s has no layer in this test: add it", pkg)
			case !depKnown:
				continue
			case sources[pkg] && sources[dep] && !(pkg == "workload/pods" && dep == "workload"):
				t.Errorf("source %s imports source %s: sources meet only in attribution", pkg, dep)
			case known && to >= from:
				t.Errorf("%s (layer %d) imports %s (layer %d): imports must point down the data flow", pkg, from, dep, to)
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
