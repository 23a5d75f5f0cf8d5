// Package doccheck holds what the tests of the rules, the dashboard and the
// exporter share to check them against docs/metrics.md and promtool.
package doccheck

import (
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// documentedMetric matches a row of a metrics table in docs/metrics.md and
// captures the metric name and the type column.
var documentedMetric = regexp.MustCompile("(?m)^\\| `(gpumem_[a-z0-9_]+)[^|]*\\|\\s*([^|]*?)\\s*\\|")

// DocumentedMetrics returns the metrics the file at path (docs/metrics.md)
// lists in its tables, with their type column.
func DocumentedMetrics(t testing.TB, path string) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	metrics := map[string]string{}
	for _, m := range documentedMetric.FindAllStringSubmatch(string(doc), -1) {
		metrics[m[1]] = m[2]
	}
	if len(metrics) < 20 {
		t.Fatalf("found only %d metrics in %s: has its table format changed?", len(metrics), path)
	}
	return metrics
}

// sectionLabels matches the sentence before a three-column table (name,
// type, meaning) that gives the labels of all its metrics:
// "Labels: `gpu, uuid, pid`."
var sectionLabels = regexp.MustCompile("Labels: `([^`]+)`")

// sortedLabels returns the comma-separated label names in cell, sorted and
// joined with commas.
func sortedLabels(cell string) string {
	var names []string
	for _, l := range strings.Split(strings.NewReplacer("`", "", " ", "").Replace(cell), ",") {
		if l != "" {
			names = append(names, l)
		}
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// DocumentedLabels returns, for each metric in the tables of the file at
// path, its label names sorted and joined with commas. Four-column rows
// (name, type, labels, meaning) give them; the allocator's three-column
// rows have the per-process labels.
func DocumentedLabels(t testing.TB, path string) map[string]string {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	section := "" // the labels the prose above a three-column table gives
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "#") {
			section = ""
		}
		if l := sectionLabels.FindStringSubmatch(line); l != nil {
			section = sortedLabels(l[1])
		}
		m := documentedMetric.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		switch {
		case len(cells) == 4:
			out[m[1]] = sortedLabels(cells[2])
		case len(cells) == 3 && section == "":
			t.Fatalf("%s: %s is in a table without a labels column, and no \"Labels: `...`\" sentence precedes it in its section", path, m[1])
		case len(cells) == 3:
			out[m[1]] = section
		}
	}
	if len(out) < 30 {
		t.Fatalf("read labels of only %d metrics from %s: has its table format changed?", len(out), path)
	}
	return out
}

// metricName matches a whole Prometheus name, colons included, so that a
// recording rule's name (gpu:gpumem_memory_used:ratio) is one token that
// does not start with gpumem_.
var metricName = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)

// productName is the program's name, which texts mention; it is no metric.
const productName = "gpumem_exporter"

// MetricNames returns the gpumem_ metric names used in text, without
// recording-rule names and the product's name.
func MetricNames(text string) []string {
	seen := map[string]bool{}
	var names []string
	for _, name := range metricName.FindAllString(text, -1) {
		name = strings.TrimRight(name, ":") // a name ending a phrase: "gpumem_exporter: ..."
		if !strings.HasPrefix(name, "gpumem_") || strings.Contains(name, ":") || name == productName || seen[name] {
			continue
		}
		seen[name] = true
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Undocumented returns the gpumem_ metric names in text that documented
// does not list. A histogram's _bucket, _sum and _count series count as the
// histogram.
func Undocumented(text string, documented map[string]string) []string {
	var missing []string
	for _, name := range MetricNames(text) {
		if _, ok := documented[name]; ok {
			continue
		}
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if documented[base] == "histogram" {
			continue
		}
		missing = append(missing, name)
	}
	return missing
}

// Promtool returns the path of promtool. Without it the test is skipped on
// a developer's machine but fails in CI, where .ci/run installs it.
func Promtool(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("promtool is not installed, and CI is set: install it (Debian: apt-get install prometheus): %v", err)
	}
	t.Skip("promtool is not installed (Debian: apt-get install prometheus)")
	return ""
}
