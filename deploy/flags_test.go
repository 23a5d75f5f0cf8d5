package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// Every exporter flag that a deployment file or a doc passes exists,
// checked against the binary's own --help-long.
func TestDeployedFlagsExist(t *testing.T) {
	t.Parallel()
	bin := os.Getenv("GPUMEM_E2E_EXPORTER")
	if bin == "" {
		module, err := filepath.Abs("..")
		if err != nil {
			t.Fatal(err)
		}
		if bin, err = exportertest.Binary(module, raceEnabled); err != nil {
			t.Fatalf("building the exporter: %v", err)
		}
	}
	cmd := exec.Command(bin, "--help-long")
	cmd.Env = exportertest.ChildEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("--help-long: %v\n%s", err, out)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`--(\[no-\])?([a-z][a-z0-9.-]*)`).FindAllStringSubmatch(string(out), -1) {
		known[m[2]] = true
		if m[1] != "" {
			known["no-"+m[2]] = true
		}
	}
	if !known["web.listen-address"] || !known["collector.gpu"] {
		t.Fatalf("--help-long does not list the expected flags:\n%s", out)
	}
	ours := regexp.MustCompile(`^(no-)?(web|log|nvml|allocstats|path|kubernetes|collector)\.`)
	flag := regexp.MustCompile(`--([a-z][a-z0-9.-]*[a-z0-9])`)
	var files []string
	for _, glob := range []string{"kubernetes/*.yaml", "helm/*/templates/*.yaml", "helm/*/values.yaml", "systemd/*", "../README.md", "../docs/*.md"} {
		m, _ := filepath.Glob(glob)
		files = append(files, m...)
	}
	sort.Strings(files)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flag.FindAllStringSubmatch(string(b), -1) {
			name := m[1]
			if !ours.MatchString(name) {
				continue
			}
			checked++
			if !known[name] {
				t.Errorf("%s passes --%s, which the exporter does not have", f, name)
			}
		}
	}
	if checked == 0 {
		t.Error("no exporter flag found in the deployment files: the test reads nothing")
	}
}
