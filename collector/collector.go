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

var (
	scrapeDurationDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "scrape", "collector_duration_seconds"),
		"Duration of a collector scrape.", []string{"collector"}, nil)
	scrapeSuccessDesc = prometheus.NewDesc(
		prometheus.BuildFQName(namespace, "scrape", "collector_success"),
		"Whether a collector succeeded.", []string{"collector"}, nil)
)

// Exporter runs the enabled collectors concurrently on each scrape.
type Exporter struct {
	src        attribution.Sources
	collectors map[string]Collector
	logger     log.Logger
}

// New builds the named collectors (all enabled ones when names is empty).
// A collector whose source is absent is left out.
func New(src Sources, logger log.Logger, names ...string) (*Exporter, error) {
	if len(names) == 0 {
		names = Enabled()
	}
	e := &Exporter{src: src.Join, collectors: map[string]Collector{}, logger: logger}
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
	sc := &Scrape{src: e.src}
	var wg sync.WaitGroup
	for name, c := range e.collectors {
		wg.Add(1)
		go func(name string, c Collector) {
			defer wg.Done()
			e.execute(name, c, sc, ch)
		}(name, c)
	}
	wg.Wait()
}

// Scrape holds what one Collect reads once for all its collectors: the
// NVML snapshot and its join with the allocator store, so that every
// collector of a scrape sees the same reading.
type Scrape struct {
	src  attribution.Sources
	once sync.Once
	view attribution.View
}

// View returns the scrape's reading of the sources, joined on first use.
func (sc *Scrape) View() attribution.View {
	sc.once.Do(func() { sc.view = sc.src.Read() })
	return sc.view
}

func (e *Exporter) execute(name string, c Collector, sc *Scrape, ch chan<- prometheus.Metric) {
	begin := time.Now()
	err := c.Update(sc, ch)
	duration := time.Since(begin)
	success := 1.0
	if err != nil {
		success = 0
		if errors.Is(err, ErrNoData) {
			level.Debug(e.logger).Log("msg", "collector returned no data", "name", name, "duration_seconds", duration.Seconds(), "err", err)
		} else {
			level.Error(e.logger).Log("msg", "collector failed", "name", name, "duration_seconds", duration.Seconds(), "err", err)
		}
	}
	ch <- prometheus.MustNewConstMetric(scrapeDurationDesc, prometheus.GaugeValue, duration.Seconds(), name)
	ch <- prometheus.MustNewConstMetric(scrapeSuccessDesc, prometheus.GaugeValue, success, name)
}
