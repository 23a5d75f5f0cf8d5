package collector

import (
	"slices"
	"testing"

	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/internal/fieldtest"
)

// rowsEqual decides whether the text cache serves the last scrape again:
// a field of a row (or of its NVML process, allocator state or workload
// info) that it does not compare would serve a stale scrape. Each one
// must make two rows differ.
func TestRowsEqualSeesEveryField(t *testing.T) {
	base, variants, unexported := fieldtest.Fields[attribution.Row]()
	// start is the join's own (which remembered labels a row matches); the
	// collectors cannot read it, so it renders nothing.
	if !slices.Equal(unexported, []string{"start"}) {
		t.Errorf("Row's unexported fields are %q, want [start]: a field the collectors cannot read must not change what they render", unexported)
	}
	again, _, _ := fieldtest.Fields[attribution.Row]()
	if !rowsEqual([]attribution.Row{base}, []attribution.Row{again}) {
		t.Fatal("two equal rows in memory of their own compare unequal")
	}
	for _, v := range variants {
		if rowsEqual([]attribution.Row{base}, []attribution.Row{v.Value}) || rowsEqual([]attribution.Row{v.Value}, []attribution.Row{base}) {
			t.Errorf("rows that differ in %s compare equal: the text cache would serve a stale scrape", v.Path)
		}
	}
	if rowsEqual([]attribution.Row{base}, []attribution.Row{base, base}) {
		t.Error("a row more compares equal")
	}
}
