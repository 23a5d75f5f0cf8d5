package collector

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpumem/gpumem_exporter/exposition"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// discard is a ResponseWriter that only counts: the benchmarks measure
// the handler, not a buffer growing to hold the body.
type discard struct {
	header http.Header
	n      int
}

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(p []byte) (int, error) { d.n += len(p); return len(p), nil }
func (d *discard) WriteHeader(int)             {}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchmarkHandler serves /metrics as Prometheus asks for it (gzip) and
// reports the median and 99th percentile latency, the CPU time of the
// process (all threads, the garbage collector's included) per scrape, and
// the body size. fresh polls the node before each scrape, untimed, so
// that every scrape sees a new snapshot and new allocator state.
func benchmarkHandler(b *testing.B, h http.Handler, poll func() error) {
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=0.9,*/*;q=0.1")
	req.Header.Set("Accept-Encoding", "gzip")
	var lat []time.Duration
	var cpu time.Duration
	w := &discard{header: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if poll != nil {
			b.StopTimer()
			if err := poll(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		clear(w.header)
		w.n = 0
		c0, t0 := cpuTime(), time.Now()
		h.ServeHTTP(w, req)
		lat = append(lat, time.Since(t0))
		cpu += cpuTime() - c0
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(len(lat)), "cpu-ms/op")
	b.ReportMetric(float64(w.n), "gzip-bytes")
}

// BenchmarkScrapeHTTP is a whole /metrics request on the simulated node,
// 8 GPUs x 16 reporting processes, with the exporter's own Go, process
// and build metrics: promhttp over one registry (the wiring before the
// text path), and the text path, with a poll before each scrape (fresh),
// without (unchanged), and with a poll before each scrape that reads the
// same figures, the processes holding steady (steady).
func BenchmarkScrapeHTTP(b *testing.B) {
	p, sim, store := simulatedNode(b, 16)
	for i := 0; i < 60; i++ {
		if err := p.Poll(); err != nil {
			b.Fatal(err)
		}
	}
	exp, err := New(sources(p, store, fakeResolver{}), log.NewNopLogger(), Names()...)
	if err != nil {
		b.Fatal(err)
	}
	// As main wired them before (client_golang's process collector, one
	// registry) and does now.
	one := prometheus.NewRegistry()
	one.MustRegister(versioncollector.NewCollector("gpumem_exporter"), collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), exp)
	others := prometheus.NewRegistry()
	others.MustRegister(versioncollector.NewCollector("gpumem_exporter"), collectors.NewGoCollector(), exposition.NewProcessCollector())
	text := exposition.NewHandler(exp, others, exposition.Options{})
	b.Run("promhttp/fresh", func(b *testing.B) {
		benchmarkHandler(b, promhttp.HandlerFor(one, promhttp.HandlerOpts{}), p.Poll)
	})
	b.Run("text/fresh", func(b *testing.B) { benchmarkHandler(b, text, p.Poll) })
	b.Run("text/unchanged", func(b *testing.B) { benchmarkHandler(b, text, nil) })

	// A poller that does not step the node: each poll reads what the last did.
	steady := nvmlpoll.NewPoller(nvmlpoll.Config{Lib: sim.Interface()})
	if err := steady.Poll(); err != nil {
		b.Fatal(err)
	}
	steadyExp, err := New(sources(steady, store, fakeResolver{}), log.NewNopLogger(), Names()...)
	if err != nil {
		b.Fatal(err)
	}
	steadyText := exposition.NewHandler(steadyExp, others, exposition.Options{})
	b.Run("text/steady", func(b *testing.B) { benchmarkHandler(b, steadyText, steady.Poll) })
}
