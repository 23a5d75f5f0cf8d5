package main

import (
	"net/http"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/version"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/collector"
	"github.com/gpumem/gpumem_exporter/exposition"
	"github.com/gpumem/gpumem_exporter/foresight"
	"github.com/gpumem/gpumem_exporter/internal/logging"
	"github.com/gpumem/gpumem_exporter/internal/ratelog"
	"github.com/gpumem/gpumem_exporter/landing"
	"github.com/gpumem/gpumem_exporter/oom"
	"github.com/gpumem/gpumem_exporter/oom/kubeevents"
	"github.com/gpumem/gpumem_exporter/workload"
)

// readers are the one join and what reads it besides the collectors: the
// forecaster (foresight) and the OOM reports.
type readers struct {
	join       attribution.Sources
	forecaster *foresight.Forecaster
	// warnBefore is the forecaster's warning threshold (negative: none).
	warnBefore time.Duration
	reports    *oom.Reports
}

// newReaders joins src and wires the route of an OOM: the store observes
// an oom message (allocstats.OOMObserver) -> oom.Reports assembles the
// report from the join -> its sinks: the ring, the log, the metrics, the
// verdict to the client (oom.VerdictReply) and, where on, the Kubernetes
// Event (kubeevents.Recorder). The forecaster takes the store's samples
// and, after each poll, the join; it warns processes through the store
// (allocstats.Store.Send).
func newReaders(o *options, src *sources, events *kubeevents.Recorder, logger log.Logger) *readers {
	warnBefore := o.warnBefore
	if warnBefore == 0 {
		warnBefore = -1 // the flag's 0: no warnings
	}
	r := &readers{warnBefore: warnBefore,
		forecaster: foresight.New(foresight.Config{WarnBefore: warnBefore, Clients: src.store, Logger: log.With(logger, "component", "foresight")})}
	// Memory labels the processes that exited, which the store keeps for
	// --allocstats.oom-linger, as they were labelled while they ran.
	r.join = attribution.Sources{NVML: src.poller, Allocator: src.store, Workload: src.backend.processes, SettleLabels: true, Memory: attribution.NewMemory(),
		Node: workload.NodeName(o.nodeName), Forecasts: r.forecaster}
	var sinks []oom.ReportSink
	if events != nil {
		sinks = append(sinks, oom.PodEvents{Recorder: events})
	}
	r.reports = oom.New(oom.Config{Capacity: o.oomReports, Sources: r.join, Fresh: src.poller.Fresh, Trends: r.forecaster, Sinks: sinks, Logger: log.With(logger, "component", "oom")})
	src.store.OnOOM(r.reports)
	src.store.OnSample(r.forecaster)
	src.poller.OnPoll(attribution.NewFollower(r.join, r.forecaster, r.reports).Observe)
	return r
}

// ownRegistry is the registry of what client_golang collects (build info,
// the exporter's own Go and process metrics, the OOM reports' and
// warnings' counters). The collectors' series are written straight to the
// text format (exposition); only a protobuf scrape gathers them through
// client_golang.
func ownRegistry(o *options, r *readers) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(versioncollector.NewCollector(exporterName), ratelog.Default, r.reports, r.forecaster)
	if !o.disableExporterMetrics {
		reg.MustRegister(collectors.NewGoCollector(), exposition.NewProcessCollector())
	}
	return reg
}

// newMux routes the exporter's endpoints: the metrics, health, the OOM
// reports' API, the landing page (and pprof in a build that has it).
func newMux(o *options, exp *collector.Exporter, reg *prometheus.Registry, r *readers, d *daemon, srv *allocstats.Server, logger log.Logger) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(o.metricsPath, exposition.NewHandler(exp, reg, exposition.Options{
		ErrorLog:            logging.PromHTTP{Logger: logger},
		MaxRequestsInFlight: 10,
		Fallback:            prometheus.Gatherers{reg, exp.Gatherer()},
	}))
	mux.Handle("/-/", d.health)
	if debugHandlers != nil {
		debugHandlers(mux)
	}
	mux.Handle("/api/v1/oom-reports", r.reports)
	mux.Handle("/", landing.New(landing.Config{
		Name:        exporterName,
		Version:     version.Version,
		Revision:    version.Revision,
		MetricsPath: o.metricsPath,
		Backend:     o.nvmlBackend,
		Socket:      srv.SocketPath(),
		Sources:     r.join,
		Forecasts:   r.forecaster,
		WarnBefore:  r.warnBefore,
		NVMLUp:      d.src.poller.Up,
		Reports:     r.reports,
	}))
	return mux
}
