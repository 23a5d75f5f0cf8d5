package allocstats

import (
	"reflect"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/fieldtest"
)

// Every field of a client's report reaches what the store keeps: a field
// added to DeviceReport that deviceEntry.apply does not carry into
// DeviceStats fails here. UUID names the device (it is the entry's key)
// and At is the clock of the floor of active memory, which one report
// alone does not move.
func TestApplyCarriesEveryReportField(t *testing.T) {
	now := time.Unix(1_750_000_000, 0)
	applied := func(r DeviceReport) DeviceStats {
		d := &deviceEntry{stats: DeviceStats{UUID: r.UUID}}
		d.apply(r, now)
		d.stats.UUID = ""
		return d.stats
	}
	base, variants, unexported := fieldtest.Fields[DeviceReport]()
	if len(unexported) > 0 {
		t.Errorf("DeviceReport has unexported fields %q", unexported)
	}
	want := applied(base)
	for _, v := range variants {
		if v.Path == "UUID" || v.Path == "At" {
			continue
		}
		if got := applied(v.Value); reflect.DeepEqual(got, want) {
			t.Errorf("a report that differs in %s is kept as the same DeviceStats %+v", v.Path, got)
		}
	}
}
