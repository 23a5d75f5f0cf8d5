package collector

import (
	"slices"
	"sort"
	"testing"

	"github.com/gpumem/gpumem_exporter/simulate/scenario"
)

// Every metric family a data collector declares is served, with samples,
// by both renderers (client_golang and the text path) on the simulated
// node's mix, per process and per pod, and each renderer serves exactly
// the families the other does. A family added to a collector fails here
// until the simulated node makes samples of it and both renderers write
// them; TestTextMatchesClientGolangOnTheSimulatedNode then holds its text
// to client_golang's byte for byte.
func TestBothRenderersServeEveryDeclaredFamily(t *testing.T) {
	for _, aggregate := range []string{AggregatePID, AggregatePod} {
		t.Run(aggregate, func(t *testing.T) {
			p, exp, reg := simulatedExporter(t, scenario.Mix, 0, aggregate)
			declared := map[string]bool{}
			byClientGolang, byText := map[string]bool{}, map[string]bool{}
			for step := 1; step <= 150; step++ {
				if err := p.Poll(); err != nil {
					t.Fatalf("step %d: poll: %v", step, err)
				}
				sc := exp.newScrape()
				for _, n := range Names() {
					rc, ok := exp.collectors[n].(rowsCollector)
					if !ok {
						continue
					}
					rs, err := rc.rows(sc)
					if err != nil {
						t.Fatalf("step %d: rows of %s: %v", step, n, err)
					}
					for _, c := range rs.columns {
						declared[c.fam.name] = true
					}
				}
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatalf("step %d: gather: %v", step, err)
				}
				for _, mf := range mfs {
					if len(mf.GetMetric()) > 0 {
						byClientGolang[mf.GetName()] = true
					}
				}
				fams, err := exp.GatherText()
				if err != nil {
					t.Fatalf("step %d: GatherText: %v", step, err)
				}
				for _, f := range fams {
					if len(f.Text) > 0 {
						byText[f.Name] = true
					}
				}
			}
			if len(declared) == 0 {
				t.Fatal("no data collector declared a family")
			}
			for name := range declared {
				if !byClientGolang[name] || !byText[name] {
					t.Errorf("%s: served by client_golang %v, by the text path %v; want samples from both on the simulated node", name, byClientGolang[name], byText[name])
				}
			}
			if a, b := keys(byClientGolang), keys(byText); !slices.Equal(a, b) {
				t.Errorf("the renderers serve different families:\nclient_golang %q\ntext          %q", a, b)
			}
		})
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
