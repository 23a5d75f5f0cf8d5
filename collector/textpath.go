package collector

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/exposition"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// rowsCollector is a data collector: its series are rows of the scrape's
// view, which GatherText writes straight to the text format.
type rowsCollector interface {
	rows(sc *Scrape) (*rowSet, error)
}

// updateRows is the Update of a rowsCollector.
func updateRows(c rowsCollector, sc *Scrape, ch chan<- prometheus.Metric) error {
	rs, err := c.rows(sc)
	if err != nil {
		return err
	}
	rs.collect(ch)
	return nil
}

var _ exposition.TextGatherer = (*Exporter)(nil)

// GatherText implements exposition.TextGatherer: every family the
// exporter exports, sorted by name, as client_golang would write them.
// The row collectors' text is rendered again only when the snapshot or
// the joined rows changed since the last call; the other collectors (the
// sources' health) are gathered each time.
func (e *Exporter) GatherText() ([]exposition.TextFamily, error) {
	names := make([]string, 0, len(e.collectors))
	for n := range e.collectors {
		names = append(names, n)
	}
	sort.Strings(names)

	out, results := e.rowsText(names)
	fams, more, err := e.adapterText(names)
	out = append(out, fams...)
	results = append(results, more...)
	slices.SortFunc(results, func(a, b result) int { return strings.Compare(a.name, b.name) })
	out = append(out, scrapeText(results)...)
	slices.SortFunc(out, func(a, b exposition.TextFamily) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// textCache is the last rendering of the row collectors and what it was
// rendered from.
type textCache struct {
	mu       sync.Mutex
	valid    bool
	snap     *nvmlpoll.Snapshot
	rows     []attribution.Row
	families []exposition.TextFamily
	errs     map[string]error
}

// rowsText renders the row collectors among names, or reuses the last
// rendering when the view is the same.
func (e *Exporter) rowsText(names []string) ([]exposition.TextFamily, []result) {
	begin := time.Now()
	sc := e.newScrape()
	v := sc.View()
	joined := time.Since(begin)

	c := &e.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	var results []result
	// A poll that read the same figures as the one rendered (processes
	// holding steady) leaves the text as it was: most scrapes then cost no
	// rendering, though a new snapshot comes every poll.
	if c.valid && (c.snap == v.Snapshot || c.snap.SameReadings(v.Snapshot)) && rowsEqual(c.rows, v.Rows) {
		c.snap, c.rows = v.Snapshot, v.Rows
		for _, n := range names {
			if _, ok := e.collectors[n].(rowsCollector); ok {
				results = append(results, result{n, time.Since(begin), c.errs[n]})
			}
		}
		return slices.Clone(c.families), results
	}
	var fams []exposition.TextFamily
	errs := map[string]error{}
	for _, n := range names {
		rc, ok := e.collectors[n].(rowsCollector)
		if !ok {
			continue
		}
		start := time.Now()
		rs, err := rc.rows(sc)
		if err == nil {
			fams = rs.appendText(fams)
		}
		errs[n] = err
		results = append(results, e.result(n, joined+time.Since(start), err))
	}
	c.valid, c.snap, c.rows, c.families, c.errs = true, v.Snapshot, v.Rows, fams, errs
	return slices.Clone(fams), results
}

// rowsEqual reports whether two joins gave the same rows, compared by
// value (each join copies the store, and each poll makes a snapshot).
func rowsEqual(a, b []attribution.Row) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := &a[i], &b[i]
		if x.GPU != y.GPU || x.UUID != y.UUID || x.PID != y.PID || x.Framework != y.Framework || x.Comm != y.Comm || x.Exited != y.Exited || x.TimeToOOM != y.TimeToOOM ||
			x.Info != y.Info || (x.NVML == nil) != (y.NVML == nil) || (x.NVML != nil && *x.NVML != *y.NVML) ||
			(x.Alloc == nil) != (y.Alloc == nil) || (x.Alloc != nil && *x.Alloc != *y.Alloc) {
			return false
		}
	}
	return true
}

// adapterSet gathers the collectors that are not row collectors (the
// sources' own health) through one registry: one Gather a scrape, where
// one registry each made up to three (every Gather makes its metric
// channels anew, tens of KB).
type adapterSet struct {
	mu      sync.Mutex // one scrape at a time: the members' sc and results are per scrape
	reg     *prometheus.Registry
	members []*adapter // sorted by name
}

// adapter is one collector of an adapterSet.
type adapter struct {
	name     string
	c        Collector
	sc       *Scrape
	err      error
	duration time.Duration
}

func (a *adapter) Describe(chan<- *prometheus.Desc) {} // unchecked

func (a *adapter) Collect(ch chan<- prometheus.Metric) {
	begin := time.Now()
	a.err = a.c.Update(a.sc, ch)
	a.duration = time.Since(begin)
}

// adapters returns the set of the collectors among names that are not row
// collectors, made on first use.
func (e *Exporter) adapters(names []string) *adapterSet {
	e.cache.mu.Lock()
	defer e.cache.mu.Unlock()
	if e.adapterSet == nil {
		set := &adapterSet{reg: prometheus.NewRegistry()}
		for _, n := range names {
			if _, ok := e.collectors[n].(rowsCollector); ok {
				continue
			}
			a := &adapter{name: n, c: e.collectors[n]}
			set.reg.MustRegister(a)
			set.members = append(set.members, a)
		}
		e.adapterSet = set
	}
	return e.adapterSet
}

// adapterText gathers the collectors that are not row collectors and
// writes their families. A gather error (two series alike, say) is put on
// the collector that made it, found by gathering each alone again; one
// that no collector makes alone (two collectors' series alike), or a
// family that cannot be encoded, is returned without failing a
// collector's success.
func (e *Exporter) adapterText(names []string) ([]exposition.TextFamily, []result, error) {
	set := e.adapters(names)
	if len(set.members) == 0 {
		return nil, nil, nil
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	sc := e.newScrape()
	for _, a := range set.members {
		a.sc, a.err, a.duration = sc, nil, 0
	}
	mfs, gatherErr := set.reg.Gather()
	gatherErrs := map[string]error{}
	if gatherErr != nil {
		for _, a := range set.members {
			alone := prometheus.NewRegistry()
			alone.MustRegister(a)
			if _, err := alone.Gather(); err != nil {
				gatherErrs[a.name] = err
			}
		}
	}
	out := make([]exposition.TextFamily, 0, len(mfs))
	var buf bytes.Buffer
	var encodeErr error
	for _, mf := range mfs {
		buf.Reset()
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			encodeErr = errors.Join(encodeErr, fmt.Errorf("encoding %s: %w", mf.GetName(), err))
			continue
		}
		out = append(out, exposition.TextFamily{Name: mf.GetName(), Text: bytes.Clone(buf.Bytes())})
	}
	results := make([]result, 0, len(set.members))
	var reported []error
	for _, a := range set.members {
		err := a.err
		if g := gatherErrs[a.name]; g != nil {
			err = errors.Join(err, g)
			reported = append(reported, fmt.Errorf("collector %s: %w", a.name, g))
		}
		results = append(results, e.result(a.name, a.duration, err))
	}
	if gatherErr != nil && len(reported) == 0 {
		reported = append(reported, gatherErr) // not one collector's alone
	}
	return out, results, errors.Join(append(reported, encodeErr)...)
}

// scrapeText writes gpumem_scrape_collector_duration_seconds and
// _success for results, which are sorted by name.
func scrapeText(results []result) []exposition.TextFamily {
	if len(results) == 0 {
		return nil
	}
	write := func(name, help string, value func(r result) float64) exposition.TextFamily {
		b := appendHeader(nil, &family{name: name, help: help, typ: prometheus.GaugeValue})
		for _, r := range results {
			b = append(b, name...)
			b = append(b, `{collector="`...)
			b = appendLabelValue(b, r.name)
			b = append(b, `"} `...)
			b = appendFloat(b, value(r))
			b = append(b, '\n')
		}
		return exposition.TextFamily{Name: name, Text: b}
	}
	return []exposition.TextFamily{
		write(scrapeDurationName, scrapeDurationHelp, func(r result) float64 { return r.duration.Seconds() }),
		write(scrapeSuccessName, scrapeSuccessHelp, result.success),
	}
}
