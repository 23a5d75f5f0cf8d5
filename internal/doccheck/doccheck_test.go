package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestUndocumentedNamesWhatTheDocLacks(t *testing.T) {
	documented := map[string]string{"gpumem_a_bytes": "gauge", "gpumem_poll_seconds": "histogram"}
	for _, tc := range []struct {
		text string
		want []string
	}{
		{`gpumem_a_bytes > 0`, nil},
		{`rate(gpumem_poll_seconds_bucket[5m]) + gpumem_poll_seconds_count`, nil},
		{`gpumem_a_bytes_bucket`, []string{"gpumem_a_bytes_bucket"}},
		{`gpu:gpumem_a_bytes:sum / gpumem_b_total`, []string{"gpumem_b_total"}},
		{`gpumem_exporter: something about gpumem_c`, []string{"gpumem_c"}},
	} {
		if got := Undocumented(tc.text, documented); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Undocumented(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

func TestDocumentedMetricsReadsTheTables(t *testing.T) {
	doc := "| metric | type |\n|---|---|\n"
	for i := 0; i < 20; i++ {
		doc += "| `gpumem_m" + string(rune('a'+i)) + "_bytes` | gauge | x |\n"
	}
	doc += "| `gpumem_poll_seconds` | histogram | | y |\nnot a row `gpumem_no`\n"
	path := filepath.Join(t.TempDir(), "metrics.md")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	got := DocumentedMetrics(t, path)
	if len(got) != 21 || got["gpumem_poll_seconds"] != "histogram" || got["gpumem_ma_bytes"] != "gauge" {
		t.Errorf("DocumentedMetrics = %v", got)
	}
	if _, ok := got["gpumem_no"]; ok {
		t.Error("a name outside a table row was taken as documented")
	}
}

func TestDocumentedLabelsReadsBothTableShapes(t *testing.T) {
	labels := DocumentedLabels(t, "../../docs/metrics.md")
	for name, want := range map[string]string{
		"gpumem_allocator_reserved_bytes": "comm,container,gpu,namespace,pid,pod,uuid,workload",
		"gpumem_gpu_memory_total_bytes":   "gpu,uuid",
		"gpumem_nvml_up":                  "",
	} {
		if got, ok := labels[name]; !ok || got != want {
			t.Errorf("labels of %s = %q (listed %v), want %q", name, got, ok, want)
		}
	}
}

func TestDocumentedLabelsOfAThreeColumnTableComeFromItsSection(t *testing.T) {
	var doc strings.Builder
	doc.WriteString("# M\n\n## A\n\nLabels: `pid, gpu`.\n\n| metric | type | meaning |\n|---|---|---|\n| `gpumem_a_bytes` | gauge | A. |\n")
	doc.WriteString("\n## B\n\nLabels: `uuid`.\n\n| metric | type | meaning |\n|---|---|---|\n| `gpumem_b_bytes` | gauge | B. |\n")
	for i := 0; i < 30; i++ { // DocumentedLabels wants a real reference's worth
		fmt.Fprintf(&doc, "| `gpumem_c%d` | gauge | `x` | C. |\n", i)
	}
	path := filepath.Join(t.TempDir(), "metrics.md")
	if err := os.WriteFile(path, []byte(doc.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	labels := DocumentedLabels(t, path)
	if labels["gpumem_a_bytes"] != "gpu,pid" || labels["gpumem_b_bytes"] != "uuid" || labels["gpumem_c0"] != "x" {
		t.Errorf("labels = a %q, b %q, c0 %q; want gpu,pid and uuid and x", labels["gpumem_a_bytes"], labels["gpumem_b_bytes"], labels["gpumem_c0"])
	}
}
