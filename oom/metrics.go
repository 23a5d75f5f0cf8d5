package oom

// The reports' metrics: the reports by cause, the events that got none,
// and each process's last cause for a while after its report.

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/diagnosis"
)

// InfoWindow is how long after a report gpumem_allocator_last_oom_info
// names its cause: longer than the OOM alert's 5-minute window.
const InfoWindow = 10 * time.Minute

var lastOOMInfo = prometheus.NewDesc("gpumem_allocator_last_oom_info",
	"The cause of the process's last out-of-memory report on the GPU (cause: limit, fragmentation, neighbours, too_large, leak, growth, contexts, unknown), for 10 minutes after it.",
	[]string{"gpu", "uuid", "pid", "comm", "namespace", "pod", "container", "cause"}, nil)

// metrics counts the reports (a ReportSink) and the events dropped, and
// reads the ring for gpumem_allocator_last_oom_info.
type metrics struct {
	dropped *prometheus.CounterVec
	byCause *prometheus.CounterVec
	reports *ring
}

func newMetrics() *metrics {
	m := &metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_oom_reports_dropped_total",
			Help: "Out-of-memory events that got no report: over the per-process (pid_rate) or per-uid (uid_rate) rate, or with the build queue full (queue_full).",
		}, []string{"reason"}),
		byCause: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_oom_reports_total",
			Help: "Out-of-memory reports, by the cause of their verdict (limit, fragmentation, neighbours, too_large, leak, growth, contexts, unknown).",
		}, []string{"cause"}),
	}
	for _, reason := range []string{dropPIDRate, dropUIDRate, dropQueueFull} {
		m.dropped.WithLabelValues(reason)
	}
	for _, c := range diagnosis.Causes() {
		m.byCause.WithLabelValues(string(c))
	}
	return m
}

// Deliver implements ReportSink: it counts rep by its cause.
func (m *metrics) Deliver(rep Report) {
	m.byCause.WithLabelValues(string(rep.Verdict.Cause)).Inc()
}

// drop counts an event that got no report, and why.
func (m *metrics) drop(reason string) { m.dropped.WithLabelValues(reason).Inc() }

// Describe implements prometheus.Collector.
func (r *Reports) Describe(ch chan<- *prometheus.Desc) {
	r.metrics.dropped.Describe(ch)
	r.metrics.byCause.Describe(ch)
	ch <- lastOOMInfo
}

// Collect implements prometheus.Collector.
func (r *Reports) Collect(ch chan<- prometheus.Metric) {
	m := r.metrics
	m.dropped.Collect(ch)
	m.byCause.Collect(ch)
	type key struct {
		pid  uint32
		uuid string
	}
	seen := map[key]bool{}
	now := time.Now()
	for _, rep := range m.reports.list() { // newest first: the last report wins
		k := key{rep.PID, rep.UUID}
		if seen[k] || now.Sub(rep.Time) > InfoWindow {
			continue
		}
		seen[k] = true
		ch <- prometheus.MustNewConstMetric(lastOOMInfo, prometheus.GaugeValue, 1,
			rep.GPU, rep.UUID, strconv.FormatUint(uint64(rep.PID), 10), rep.Comm, rep.Namespace, rep.Pod, rep.Container, string(rep.Verdict.Cause))
	}
}
