// Package collector turns the attribution join (the latest NVML snapshot,
// the allocator store and the workload cache) and the sources' own health
// into Prometheus metrics. Collectors register themselves
// from init() and each gets a --collector.<name> flag, as in node_exporter.
// No collector calls NVML or reads /proc: scrapes cost only the metrics.
package collector

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/attribution"
)

const namespace = "gpumem"

// ErrNoData means a collector's source had nothing to read this scrape
// (NVML not polled yet). As in node_exporter, it is logged at debug and
// reported as gpumem_scrape_collector_success 0: the collector did not
// deliver.
var ErrNoData = errors.New("collector returned no data")

// Collector is one source of metrics. Update sends the metrics of one
// scrape; sc holds what the scrape reads once for every collector.
type Collector interface {
	Update(sc *Scrape, ch chan<- prometheus.Metric) error
}

// factory builds a collector; it returns a nil Collector (and no error)
// when the collector's source does not exist in this daemon (no Kubernetes,
// say).
type factory func(src Sources, logger log.Logger) (Collector, error)

var (
	factoriesMu sync.Mutex
	factories   = map[string]factory{}
	states      = map[string]*bool{}
	defaults    = map[string]bool{}
)

func registerCollector(name string, enabledByDefault bool, f factory) {
	help := fmt.Sprintf("Enable the %s collector (default: %s).", name, map[bool]string{true: "enabled", false: "disabled"}[enabledByDefault])
	def := map[bool]string{true: "true", false: "false"}[enabledByDefault]
	// Pre-set: kingpin applies a default only when it parses, and tests
	// and library users build exporters without parsing flags.
	flag := new(bool)
	*flag = enabledByDefault
	kingpin.Flag("collector."+name, help).Default(def).BoolVar(flag)
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	factories[name] = f
	states[name] = flag
	defaults[name] = enabledByDefault
}

// Names lists the registered collectors.
func Names() []string {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	var names []string
	for n := range factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Enabled returns the collectors enabled by flags (or by default when the
// flags were not parsed).
func Enabled() []string {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	var names []string
	for n, on := range states {
		if *on {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

const (
	scrapeDurationName = namespace + "_scrape_collector_duration_seconds"
	scrapeDurationHelp = "Duration of a collector scrape."
	scrapeSuccessName  = namespace + "_scrape_collector_success"
	scrapeSuccessHelp  = "Whether a collector succeeded."
)

var (
	scrapeDurationDesc = prometheus.NewDesc(scrapeDurationName, scrapeDurationHelp, []string{"collector"}, nil)
	scrapeSuccessDesc  = prometheus.NewDesc(scrapeSuccessName, scrapeSuccessHelp, []string{"collector"}, nil)
)

// Exporter runs the enabled collectors on each scrape. As a
// prometheus.Collector it is the reference (and what protobuf scrapes
// get); GatherText writes the same series in the text format without
// building client_golang metrics, and reuses the data collectors' text
// while the NVML snapshot and the joined rows are unchanged.
type Exporter struct {
	src        attribution.Sources
	collectors map[string]Collector
	logger     log.Logger
	// aggregate is AggregatePID or AggregatePod.
	aggregate string
	agg       *aggregator

	// For GatherText: the collectors that are not row collectors behind
	// one registry, and the last rendering of the row collectors.
	adapterSet *adapterSet
	cache      textCache
	gatherer   prometheus.Gatherer
}

// New builds the named collectors (all enabled ones when names is empty).
// A collector whose source is absent is left out.
func New(src Sources, logger log.Logger, names ...string) (*Exporter, error) {
	if len(names) == 0 {
		names = Enabled()
	}
	e := &Exporter{
		src: src.Join, collectors: map[string]Collector{}, logger: logger,
		aggregate: *processAggregation, agg: newAggregator(),
	}
	for _, n := range names {
		factoriesMu.Lock()
		f, ok := factories[n]
		factoriesMu.Unlock()
		if !ok {
			return nil, fmt.Errorf("unknown collector %q", n)
		}
		c, err := f(src, log.With(logger, "collector", n))
		if err != nil {
			return nil, fmt.Errorf("creating collector %s: %w", n, err)
		}
		if c == nil {
			continue
		}
		e.collectors[n] = c
	}
	return e, nil
}

// Describe implements prometheus.Collector. The exporter is unchecked: its
// series vary with the GPUs and processes present.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	ch <- scrapeDurationDesc
	ch <- scrapeSuccessDesc
}

// Collect implements prometheus.Collector.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	sc := e.newScrape()
	var wg sync.WaitGroup
	for name, c := range e.collectors {
		wg.Add(1)
		go func(name string, c Collector) {
			defer wg.Done()
			begin := time.Now()
			err := c.Update(sc, ch)
			r := e.result(name, time.Since(begin), err)
			ch <- prometheus.MustNewConstMetric(scrapeDurationDesc, prometheus.GaugeValue, r.duration.Seconds(), name)
			ch <- prometheus.MustNewConstMetric(scrapeSuccessDesc, prometheus.GaugeValue, r.success(), name)
		}(name, c)
	}
	wg.Wait()
}

// Gatherer returns a registry holding only the exporter: what a protobuf
// scrape gathers, through promhttp.
func (e *Exporter) Gatherer() prometheus.Gatherer {
	e.cache.mu.Lock()
	defer e.cache.mu.Unlock()
	if e.gatherer == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(e)
		e.gatherer = reg
	}
	return e.gatherer
}

func (e *Exporter) newScrape() *Scrape {
	sc := &Scrape{src: e.src}
	if e.aggregate == AggregatePod {
		sc.agg = e.agg
	}
	return sc
}

// Scrape holds what one Collect reads once for all its collectors: the
// NVML snapshot and its join with the allocator store, so that every
// collector of a scrape sees the same reading.
type Scrape struct {
	src      attribution.Sources
	agg      *aggregator // nil: one row per process
	once     sync.Once
	view     attribution.View
	rowsOnce sync.Once
	rows     []attribution.Row
}

// View returns the scrape's reading of the sources, joined on first use.
func (sc *Scrape) View() attribution.View {
	sc.once.Do(func() { sc.view = sc.src.Read() })
	return sc.view
}

// Rows returns the rows the process and allocator collectors export: the
// view's, or with --collector.process.aggregate=pod one per container and
// device for processes in a pod.
func (sc *Scrape) Rows() []attribution.Row {
	sc.rowsOnce.Do(func() {
		sc.rows = sc.View().Rows
		if sc.agg != nil {
			sc.rows = sc.agg.aggregate(sc.rows)
		}
	})
	return sc.rows
}

// result is how one collector did in one scrape.
type result struct {
	name     string
	duration time.Duration
	err      error
}

func (r result) success() float64 {
	if r.err != nil {
		return 0
	}
	return 1
}

// result logs a collector's failure (ErrNoData at debug) and returns its
// result.
func (e *Exporter) result(name string, duration time.Duration, err error) result {
	if err != nil {
		if errors.Is(err, ErrNoData) {
			level.Debug(e.logger).Log("msg", "collector returned no data", "name", name, "duration_seconds", duration.Seconds(), "err", err)
		} else {
			level.Error(e.logger).Log("msg", "collector failed", "name", name, "duration_seconds", duration.Seconds(), "err", err)
		}
	}
	return result{name, duration, err}
}
