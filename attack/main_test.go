package attack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// The roles a re-executed test binary plays (exportertest.RoleEnv)
// instead of running the tests: security_test.go's and linger_test.go's.
var roles = map[string]func() int{
	"sec-attacker": runAttacker,
	"sec-victim":   runVictim,
}

func TestMain(m *testing.M) {
	if run, ok := roles[os.Getenv(exportertest.RoleEnv)]; ok {
		os.Exit(run())
	}
	os.Exit(m.Run())
}

// exporterBinary is the exporter the tests attack: GPUMEM_ATTACK_EXPORTER,
// or the module's main package built (once, cached) with -race when this
// test binary has it; race says whether it has the race detector.
func exporterBinary(t *testing.T) (path string, race bool) {
	t.Helper()
	module, err := filepath.Abs("..")
	if err == nil {
		path, err = exportertest.ExporterBinary("GPUMEM_ATTACK_EXPORTER", module, exportertest.RaceEnabled)
	}
	if err == nil {
		race, err = exportertest.BuiltWithRace(path)
	}
	if err != nil {
		t.Fatalf("the exporter binary: %v", err)
	}
	return path, race
}

// startExporter runs the exporter (exportertest.Start) until the test ends.
func startExporter(t *testing.T, args ...string) *exportertest.Exporter {
	t.Helper()
	bin, _ := exporterBinary(t)
	return exportertest.Start(t, exportertest.BinaryCommand(bin), args...)
}
