package exposition

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// registryText is a TextGatherer over a registry, encoded with expfmt:
// what the exporter's text path must equal.
type registryText struct{ g prometheus.Gatherer }

func (r registryText) GatherText() ([]TextFamily, error) {
	mfs, err := r.g.Gather()
	var out []TextFamily
	for _, mf := range mfs {
		var b bytes.Buffer
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			return nil, err
		}
		out = append(out, TextFamily{Name: mf.GetName(), Text: b.Bytes()})
	}
	return out, err
}

func gauge(reg *prometheus.Registry, name string, v float64) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "Help of " + name + "."})
	g.Set(v)
	reg.MustRegister(g)
}

// fixture returns two registries whose family names interleave, and one
// holding both.
func fixture() (text, others, both *prometheus.Registry) {
	text, others, both = prometheus.NewRegistry(), prometheus.NewRegistry(), prometheus.NewRegistry()
	for i, name := range []string{"a_first", "b_second", "c_third", "d_fourth", "e_fifth"} {
		if i%2 == 0 {
			gauge(text, name, float64(i))
		} else {
			gauge(others, name, float64(i))
		}
		gauge(both, name, float64(i))
	}
	return text, others, both
}

func get(t *testing.T, h http.Handler, header http.Header) *http.Response {
	t.Helper()
	req := httptest.NewRequest("GET", "/metrics", nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	var r io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatalf("gzip: %v", err)
		}
		r = zr
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The body is what promhttp serves from one registry holding both
// sources, with and without gzip, and with the same content type.
func TestHandlerServesWhatPromhttpWouldFromOneRegistry(t *testing.T) {
	text, others, both := fixture()
	h := NewHandler(registryText{text}, others, Options{})
	ref := promhttp.HandlerFor(both, promhttp.HandlerOpts{})
	for _, accept := range []string{"", "gzip", "gzip;q=0, identity", "br, gzip;q=0.5"} {
		header := http.Header{"Accept-Encoding": {accept}}
		got, want := get(t, h, header), get(t, ref, header)
		if g, w := body(t, got), body(t, want); g != w {
			t.Errorf("Accept-Encoding %q: body\n%s\nwant\n%s", accept, g, w)
		}
		for _, k := range []string{"Content-Type", "Content-Encoding"} {
			if g, w := got.Header.Get(k), want.Header.Get(k); g != w {
				t.Errorf("Accept-Encoding %q: %s %q, want %q", accept, k, g, w)
			}
		}
	}
}

// The body goes out in one write with its length, and a kept buffer or
// compressor carries nothing into the next scrape: scrapes in turn, plain
// and gzip, each serve the whole body once.
func TestHandlerWritesTheLengthAndKeepsNothingBetweenScrapes(t *testing.T) {
	text, others, both := fixture()
	h := NewHandler(registryText{text}, others, Options{})
	want := body(t, get(t, promhttp.HandlerFor(both, promhttp.HandlerOpts{}), nil))
	for i, accept := range []string{"gzip", "", "gzip", "gzip", "", ""} {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Accept-Encoding", accept)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		resp := rec.Result()
		if got := resp.Header.Get("Content-Length"); got != strconv.Itoa(rec.Body.Len()) {
			t.Errorf("scrape %d (%q): Content-Length %q for a body of %d bytes", i, accept, got, rec.Body.Len())
		}
		if got := body(t, resp); got != want {
			t.Errorf("scrape %d (%q): body\n%s\nwant\n%s", i, accept, got, want)
		}
	}
}

// A scraper asking for protobuf gets it from the fallback.
func TestHandlerServesProtobufFromTheFallback(t *testing.T) {
	text, others, both := fixture()
	h := NewHandler(registryText{text}, others, Options{Fallback: both})
	resp := get(t, h, http.Header{"Accept": {"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3"}})
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "protobuf") {
		t.Fatalf("Content-Type %q, want protobuf", ct)
	}
	dec := expfmt.NewDecoder(resp.Body, expfmt.Format(resp.Header.Get("Content-Type")))
	var names []string
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		names = append(names, mf.GetName())
	}
	if strings.Join(names, ",") != "a_first,b_second,c_third,d_fourth,e_fifth" {
		t.Errorf("protobuf families %v, want all five", names)
	}
}

type logged struct {
	mu    sync.Mutex
	lines []string
}

func (l *logged) Println(v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprint(v...))
}

type failingText struct{ TextGatherer }

func (f failingText) GatherText() ([]TextFamily, error) {
	fams, _ := f.TextGatherer.GatherText()
	return fams, errors.New("one source broke")
}

// As promhttp's ContinueOnError: what was gathered is served and the
// errors are logged; a family both sources return is served once.
func TestHandlerServesWhatItGatheredAndLogsTheRest(t *testing.T) {
	text, others, _ := fixture()
	gauge(others, "c_third", 99) // also in text
	log := &logged{}
	h := NewHandler(failingText{registryText{text}}, others, Options{ErrorLog: log})
	got := body(t, get(t, h, nil))
	if n := strings.Count(got, "# TYPE c_third"); n != 1 {
		t.Errorf("c_third served %d times, want once:\n%s", n, got)
	}
	if !strings.Contains(got, "c_third 2\n") || !strings.Contains(got, "e_fifth 4\n") {
		t.Errorf("the text source's families are missing:\n%s", got)
	}
	joined := strings.Join(log.lines, "\n")
	for _, want := range []string{"one source broke", "c_third"} {
		if !strings.Contains(joined, want) {
			t.Errorf("log %q does not mention %q", joined, want)
		}
	}
}

type blockingText struct {
	started, release chan struct{}
}

func (b blockingText) GatherText() ([]TextFamily, error) {
	b.started <- struct{}{}
	<-b.release
	return nil, nil
}

func TestHandlerLimitsRequestsInFlight(t *testing.T) {
	b := blockingText{started: make(chan struct{}), release: make(chan struct{})}
	h := NewHandler(b, nil, Options{MaxRequestsInFlight: 1})
	done := make(chan int)
	go func() { done <- get(t, h, nil).StatusCode }()
	<-b.started
	if code := get(t, h, nil).StatusCode; code != http.StatusServiceUnavailable {
		t.Errorf("a second scrape while one runs: %d, want 503", code)
	}
	close(b.release)
	if code := <-done; code != http.StatusOK {
		t.Errorf("the first scrape: %d, want 200", code)
	}
}

func TestAcceptsGzip(t *testing.T) {
	for header, want := range map[string]bool{
		"": false, "gzip": true, "GZIP": true, "deflate, gzip": true, "gzip;q=0": false, "gzip; q=0.001": true,
		"identity": false, "x-gzip": false, "br;q=1.0, gzip;q=0.8, *;q=0.1": true,
	} {
		if got := acceptsGzip(header); got != want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", header, got, want)
		}
	}
}
