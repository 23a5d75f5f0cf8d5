// Package exposition serves /metrics. Families that a TextGatherer has
// already written in the text format are merged, by name, with those a
// prometheus.Gatherer gathers (the exporter's own Go and process metrics,
// build info), so that the body is what promhttp would serve from one
// registry holding them all, without building a client_golang metric for
// each per-process series. gzip runs at BestSpeed
// (klauspost/compress: half the CPU of the standard library's, for a
// smaller body). A scraper that asks
// for another format (protobuf) is served by promhttp from Fallback.
package exposition

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// TextFamily is one metric family in the text exposition format (version
// 0.0.4): its # HELP and # TYPE lines, then its samples.
type TextFamily struct {
	Name string
	Text []byte
}

// TextGatherer gathers families already written in the text format. The
// texts must not change after they are returned (they may be served from a
// cache while another scrape runs). Families whose names another gatherer
// of the same handler also returns are an error.
type TextGatherer interface {
	GatherText() ([]TextFamily, error)
}

// Options configure the handler.
type Options struct {
	// ErrorLog gets gather and write errors; nil: none are logged.
	ErrorLog promhttp.Logger
	// MaxRequestsInFlight bounds concurrent scrapes; more get 503. 0: no
	// bound.
	MaxRequestsInFlight int
	// Fallback serves the formats other than text (protobuf), through
	// promhttp; it must gather everything that the handler's two sources
	// do. Nil: those scrapers get the text format too.
	Fallback prometheus.Gatherer
}

// Handler serves one scrape.
type Handler struct {
	text     TextGatherer
	others   prometheus.Gatherer
	opts     Options
	inFlight chan struct{}
	fallback http.Handler
	// gzips keeps compressors between scrapes (a sync.Pool loses them at
	// every garbage collection, and each costs about 1 MB to make).
	gzips chan *gzip.Writer
	// buffers keeps body buffers between scrapes, likewise.
	buffers chan *bytes.Buffer
}

// NewHandler returns the /metrics handler of text and others.
func NewHandler(text TextGatherer, others prometheus.Gatherer, opts Options) *Handler {
	h := &Handler{text: text, others: others, opts: opts}
	if opts.MaxRequestsInFlight > 0 {
		h.inFlight = make(chan struct{}, opts.MaxRequestsInFlight)
	}
	if opts.Fallback != nil {
		h.fallback = promhttp.HandlerFor(opts.Fallback, promhttp.HandlerOpts{
			ErrorLog:            opts.ErrorLog,
			ErrorHandling:       promhttp.ContinueOnError,
			MaxRequestsInFlight: opts.MaxRequestsInFlight,
		})
	}
	kept := max(1, min(opts.MaxRequestsInFlight, 4))
	h.gzips = make(chan *gzip.Writer, kept)
	h.buffers = make(chan *bytes.Buffer, kept)
	return h
}

func (h *Handler) logf(format string, args ...any) {
	if h.opts.ErrorLog != nil {
		h.opts.ErrorLog.Println(fmt.Sprintf(format, args...))
	}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	format := expfmt.Negotiate(r.Header)
	if format.FormatType() != expfmt.TypeTextPlain {
		if h.fallback != nil {
			h.fallback.ServeHTTP(w, r)
			return
		}
		format = expfmt.NewFormat(expfmt.TypeTextPlain)
	}
	if h.inFlight != nil {
		select {
		case h.inFlight <- struct{}{}:
			defer func() { <-h.inFlight }()
		default:
			http.Error(w, fmt.Sprintf("Limit of concurrent requests reached (%d), try again later.", h.opts.MaxRequestsInFlight), http.StatusServiceUnavailable)
			return
		}
	}
	texts, others := h.gather()
	// The body is rendered into a kept buffer, then written at once with
	// its length: one write instead of a chunked one every 4 KiB.
	buf := h.buffer()
	defer h.keepBuffer(buf)
	header := w.Header()
	header.Set("Content-Type", string(format))
	header.Add("Vary", "Accept-Encoding")
	var body io.Writer = buf
	var gz *gzip.Writer
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		header.Set("Content-Encoding", "gzip")
		gz = h.gzipWriter(buf)
		defer h.keepGzip(gz)
		body = gz
	}
	if err := write(body, texts, others); err != nil {
		h.logf("error writing the metrics: %v", err)
	}
	if gz != nil {
		if err := gz.Close(); err != nil {
			h.logf("error closing the gzip stream: %v", err)
		}
	}
	header.Set("Content-Length", strconv.Itoa(buf.Len()))
	if _, err := w.Write(buf.Bytes()); err != nil {
		h.logf("error writing the response: %v", err)
	}
}

// buffer returns a kept body buffer, or a new one.
func (h *Handler) buffer() *bytes.Buffer {
	select {
	case b := <-h.buffers:
		return b
	default:
		return new(bytes.Buffer)
	}
}

// keepBuffer keeps b for a later scrape, unless enough are kept or it
// grew far past what a scrape needs (a one-off).
func (h *Handler) keepBuffer(b *bytes.Buffer) {
	if b.Cap() > maxKeptBuffer {
		return
	}
	b.Reset()
	select {
	case h.buffers <- b:
	default:
	}
}

// maxKeptBuffer is the largest body buffer kept between scrapes: about
// 20,000 per-process series.
const maxKeptBuffer = 4 << 20

// keepGzip keeps a compressor for a later scrape.
func (h *Handler) keepGzip(gz *gzip.Writer) {
	gz.Reset(nil)
	select {
	case h.gzips <- gz:
	default: // enough kept
	}
}

// gzipWriter returns a kept compressor, or a new one, writing to w.
func (h *Handler) gzipWriter(w io.Writer) *gzip.Writer {
	select {
	case gz := <-h.gzips:
		gz.Reset(w)
		return gz
	default:
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		return gz
	}
}

// gather runs both sources; errors are logged and what was gathered is
// served, as promhttp's ContinueOnError does.
func (h *Handler) gather() ([]TextFamily, []*dto.MetricFamily) {
	texts, err := h.text.GatherText()
	if err != nil {
		h.logf("error gathering metrics: %v", err)
	}
	var others []*dto.MetricFamily
	if h.others != nil {
		others, err = h.others.Gather()
		if err != nil {
			h.logf("error gathering metrics: %v", err)
		}
	}
	return texts, others
}

// write writes both lists merged by family name. A name in both is
// written once, from texts, and the duplicate is reported.
func write(w io.Writer, texts []TextFamily, others []*dto.MetricFamily) error {
	byName := func(a, b TextFamily) int { return strings.Compare(a.Name, b.Name) }
	if !slices.IsSortedFunc(texts, byName) {
		texts = slices.Clone(texts) // the gatherer's slice may be shared
		slices.SortStableFunc(texts, byName)
	}
	var dup []string
	i, j := 0, 0
	for i < len(texts) || j < len(others) {
		switch {
		case j == len(others) || (i < len(texts) && texts[i].Name <= others[j].GetName()):
			if j < len(others) && texts[i].Name == others[j].GetName() {
				dup = append(dup, texts[i].Name)
				j++
			}
			if _, err := w.Write(texts[i].Text); err != nil {
				return err
			}
			i++
		default:
			if _, err := expfmt.MetricFamilyToText(w, others[j]); err != nil {
				return fmt.Errorf("encoding %s: %w", others[j].GetName(), err)
			}
			j++
		}
	}
	if len(dup) > 0 {
		return fmt.Errorf("families gathered twice, served once: %s", strings.Join(dup, ", "))
	}
	return nil
}

// acceptsGzip reports whether an Accept-Encoding header accepts gzip.
func acceptsGzip(header string) bool {
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			continue
		}
		q := 1.0
		for p := range strings.SplitSeq(params, ";") {
			if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(strings.TrimSpace(k), "q") {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					q = f
				}
			}
		}
		return q > 0
	}
	return false
}
