package prometheus

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/doccheck"
)

// fleet-rules.yml: recording rules for large fleets (docs/scaling.md),
// checked on their own so that they load with or without rules.yml.
const (
	fleetRulesFile     = "fleet-rules.yml"
	fleetRulesTestFile = "fleet-rules_test.yml"
)

func TestFleetRules(t *testing.T) {
	t.Parallel()
	promtool := doccheck.Promtool(t)
	for _, args := range [][]string{
		{"check", "rules", fleetRulesFile},
		{"test", "rules", fleetRulesTestFile},
	} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var fleetRecordName = regexp.MustCompile(`(?m)^\s*- record: (\S+)\s*$`)

// Both files load into one Prometheus: none records what the other does.
func TestFleetRulesRecordNothingRulesYmlDoes(t *testing.T) {
	t.Parallel()
	records := func(path string) map[string]bool {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, m := range fleetRecordName.FindAllStringSubmatch(string(text), -1) {
			out[m[1]] = true
		}
		return out
	}
	fleet, base := records(fleetRulesFile), records(rulesFile)
	if len(fleet) == 0 {
		t.Fatalf("no recording rules found in %s", fleetRulesFile)
	}
	for name := range fleet {
		if base[name] {
			t.Errorf("%s records %s, which %s records too", fleetRulesFile, name, rulesFile)
		}
	}
}

func TestFleetRulesUseOnlyDocumentedMetrics(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile(fleetRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	documented := doccheck.DocumentedMetrics(t, "../../docs/metrics.md")
	if missing := doccheck.Undocumented(string(text), documented); len(missing) > 0 {
		t.Errorf("%s uses metrics that docs/metrics.md does not document: %s", fleetRulesFile, strings.Join(missing, ", "))
	}
}
