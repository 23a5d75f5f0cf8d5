package attack

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// roleEnv tells a re-executed test binary what to be: "sec-attacker" or
// "sec-victim" (security_test.go) instead of running the tests.
const roleEnv = "GPUMEM_TEST_ROLE"

var roles = map[string]func() int{
	"sec-attacker": runAttacker,
	"sec-victim":   runVictim,
}

func TestMain(m *testing.M) {
	if run, ok := roles[os.Getenv(roleEnv)]; ok {
		os.Exit(run())
	}
	os.Exit(m.Run())
}

var exporter struct {
	once sync.Once
	path string
	race bool // built with the race detector
	err  error
}

// exporterBinary is the exporter the tests attack: GPUMEM_ATTACK_EXPORTER,
// or the module's main package built (once, cached) with -race when this
// test binary has it.
func exporterBinary(t *testing.T) (path string, race bool) {
	t.Helper()
	exporter.once.Do(func() {
		exporter.path = os.Getenv("GPUMEM_ATTACK_EXPORTER")
		if exporter.path == "" {
			var module string
			if module, exporter.err = filepath.Abs(".."); exporter.err != nil {
				return
			}
			if exporter.path, exporter.err = exportertest.Binary(module, raceEnabled); exporter.err != nil {
				return
			}
		}
		info, err := buildinfo.ReadFile(exporter.path)
		if err != nil {
			exporter.err = fmt.Errorf("reading the build info of %s: %w", exporter.path, err)
			return
		}
		for _, s := range info.Settings {
			exporter.race = exporter.race || (s.Key == "-race" && s.Value == "true")
		}
	})
	if exporter.err != nil {
		t.Fatalf("the exporter binary: %v", exporter.err)
	}
	return exporter.path, exporter.race
}

// startExporter runs the exporter (exportertest.Start) until the test ends.
func startExporter(t *testing.T, args ...string) *exportertest.Exporter {
	t.Helper()
	bin, _ := exporterBinary(t)
	return exportertest.Start(t, func(args ...string) *exec.Cmd { return exec.Command(bin, args...) }, args...)
}
