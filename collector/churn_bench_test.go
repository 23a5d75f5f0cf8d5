package collector

import (
	"bytes"
	"testing"

	"github.com/gpumem/gpumem_exporter/simulate"
	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// BenchmarkSeriesChurn runs the simulated node for an hour of one-second
// polls, scraped every 15 s, and counts what Prometheus would hold: the
// series of one scrape (live, the last scrape's), and every distinct
// series seen in the hour (what the head block creates). Run it once:
//
//	go test -run='^$' -bench=SeriesChurn -benchtime=1x ./collector/
func BenchmarkSeriesChurn(b *testing.B) {
	for _, tc := range []struct {
		name, scenario string
		perGPU         int
	}{
		{"mix", scenario.Mix, 0},
		{"load16", simulate.Load, 16},
	} {
		for _, mode := range []string{AggregatePID, AggregatePod} {
			b.Run(tc.name+"/"+mode, func(b *testing.B) {
				for b.Loop() {
					p, exp, _ := simulatedExporter(b, tc.scenario, tc.perGPU, mode)
					seen := map[string]bool{}
					var live, processLive int
					for step := 1; step <= 3600; step++ {
						if err := p.Poll(); err != nil {
							b.Fatal(err)
						}
						if step%15 != 0 {
							continue
						}
						fams, err := exp.GatherText()
						if err != nil {
							b.Fatal(err)
						}
						live, processLive = 0, 0
						for _, f := range fams {
							for _, line := range bytes.Split(f.Text, []byte("\n")) {
								if len(line) == 0 || line[0] == '#' {
									continue
								}
								series := string(line[:bytes.LastIndexByte(line, ' ')])
								seen[series] = true
								live++
								if bytes.HasPrefix(line, []byte("gpumem_process_")) || bytes.HasPrefix(line, []byte("gpumem_allocator_")) {
									processLive++
								}
							}
						}
					}
					b.ReportMetric(float64(live), "live-series")
					b.ReportMetric(float64(processLive), "live-process-series")
					b.ReportMetric(float64(len(seen)), "series-per-hour")
				}
			})
		}
	}
}
