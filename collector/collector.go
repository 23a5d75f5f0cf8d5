// Package collector turns the latest NVML snapshot, the allocator store and
// the workload cache into Prometheus metrics. Collectors register themselves
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
)

const namespace = "gpumem"

// ErrNoData means a collector had nothing to report this scrape; it is not
// a failure.
var ErrNoData = errors.New("collector returned no data")

// Collector is one source of metrics.
type Collector interface {
	Update(ch chan<- prometheus.Metric) error
}

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
	collectors map[string]Collector
	logger     log.Logger
}

// New builds the named collectors (all enabled ones when names is empty).
func New(src Sources, logger log.Logger, names ...string) (*Exporter, error) {
	if len(names) == 0 {
		names = Enabled()
	}
	e := &Exporter{collectors: map[string]Collector{}, logger: logger}
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
	sc := &scrape{}
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

// scrape holds what one Collect computes once for all its collectors: the
// join of NVML's processes with the allocator store, which both the process
// and the allocator collectors read.
type scrape struct {
	once     sync.Once
	holdings []Holding
}

func (sc *scrape) rows(src Sources) []Holding {
	sc.once.Do(func() { sc.holdings = src.rows() })
	return sc.holdings
}

// scrapeCollector is a Collector that shares the per-scrape join.
type scrapeCollector interface {
	updateScrape(sc *scrape, ch chan<- prometheus.Metric) error
}

func (e *Exporter) execute(name string, c Collector, sc *scrape, ch chan<- prometheus.Metric) {
	begin := time.Now()
	var err error
	if shared, ok := c.(scrapeCollector); ok {
		err = shared.updateScrape(sc, ch)
	} else {
		err = c.Update(ch)
	}
	duration := time.Since(begin)
	success := 1.0
	if err != nil {
		if errors.Is(err, ErrNoData) {
			level.Debug(e.logger).Log("msg", "collector returned no data", "name", name, "duration_seconds", duration.Seconds(), "err", err)
		} else {
			level.Error(e.logger).Log("msg", "collector failed", "name", name, "duration_seconds", duration.Seconds(), "err", err)
			success = 0
		}
	}
	ch <- prometheus.MustNewConstMetric(scrapeDurationDesc, prometheus.GaugeValue, duration.Seconds(), name)
	ch <- prometheus.MustNewConstMetric(scrapeSuccessDesc, prometheus.GaugeValue, success, name)
}
