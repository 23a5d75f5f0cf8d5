package allocstats

import (
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"strings"
	"testing"
	"time"
)

// BenchmarkStoreProcesses: what the collector pays per scrape for 1000
// reporting processes with 8 devices each.
func BenchmarkStoreProcesses(b *testing.B) {
	s := NewStore(time.Minute)
	s.SetProcessLimits(1000, 1000)
	reports := make([]DeviceReport, 8)
	for i := range reports {
		reports[i] = DeviceReport{UUID: fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000000", i), Reserved: 1 << 30, Active: Some(1 << 29), AllocRetries: Some(1), OOMs: Some(0)}
	}
	for pid := uint32(1); pid <= 1000; pid++ {
		if _, err := s.stats(nil, Identity{PID: pid, StartTime: 1}, reports, t0, DefaultMaxDevices); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if ps := s.Processes(); len(ps) != 1000 {
			b.Fatal(len(ps))
		}
	}
}

// BenchmarkDecodeStats: one stats line of 8 devices with every field, as
// the Python client sends it on an 8-GPU process.
func BenchmarkDecodeStats(b *testing.B) {
	var entries []string
	for i := 0; i < 8; i++ {
		entries = append(entries, fmt.Sprintf(`{"uuid":"GPU-%08x-4e5f-6789-abcd-ef0123456789","reserved_bytes":962592768,"active_bytes":960495616,"allocated_bytes":960495616,"inactive_split_bytes":2097152,"peak_reserved_bytes":3122659328,"peak_active_bytes":2160066560,"limit_bytes":4294967296,"alloc_retries":1,"ooms":1}`, i))
	}
	line := []byte(`{"v":1,"type":"stats","devices":[` + strings.Join(entries, ",") + `]}`)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.DecodeLine(line, DefaultMaxDevices); err != nil {
			b.Fatal(err)
		}
	}
}
