// Package landing serves the exporter's landing page: what runs, links, and
// a live picture of each GPU's memory split into context, active, inactive,
// unattributed and free, with the last out-of-memory reports.
package landing

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"net/http"

	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/oom"
)

//go:embed page.html
var files embed.FS

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"bytes": FormatBytes,
	"pct":   func(v, total uint64) string { return fmt.Sprintf("%.3f", percent(v, total)) },
}).ParseFS(files, "page.html"))

// Config is what the page shows.
type Config struct {
	Name, Version, Revision, MetricsPath, Backend, Socket string
	// Sources is the join the page reads, the same as /metrics.
	Sources attribution.Sources
	NVMLUp  func() bool
	Reports interface{ List() []oom.Report }
}

// Handler serves the landing page at "/" and 404 elsewhere.
type Handler struct{ cfg Config }

// New returns the landing page handler.
func New(cfg Config) *Handler { return &Handler{cfg: cfg} }

// GPUView is one device's memory split as the page shows it.
type GPUView struct {
	GPU, UUID, Name                    string
	Total                              uint64
	Context, Active, Inactive, NoStats uint64
	Unattributed, DriverReserved, Free uint64
	Processes                          []ProcessView
}

// ProcessView is one process row under a GPU.
type ProcessView struct {
	PID                                 uint32
	Used                                uint64
	Reports                             bool
	Context, Active, Inactive, Reserved uint64
	Framework                           string
	Comm, Namespace, Pod, Container     string // when known
}

type data struct {
	Config
	Up      bool
	GPUs    []GPUView
	Reports []oom.Report
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	d := data{Config: h.cfg}
	if h.cfg.NVMLUp != nil {
		d.Up = h.cfg.NVMLUp()
	}
	d.GPUs = Split(h.cfg.Sources.Read())
	if h.cfg.Reports != nil {
		d.Reports = h.cfg.Reports.List()
	}
	var buf bytes.Buffer
	if err := page.Execute(&buf, d); err != nil {
		http.Error(w, "rendering the landing page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// Split divides each device's memory into the spec's parts. A process that
// reports allocator stats splits into context, active and inactive; one
// that does not counts whole under NoStats. It reads the same join as the
// collectors, so that the page and /metrics agree.
func Split(v attribution.View) []GPUView {
	snap, rows := v.Snapshot, v.Rows
	if snap == nil {
		return nil
	}
	byUUID := make(map[string][]*attribution.Row)
	for i := range rows {
		if rows[i].NVML != nil {
			byUUID[rows[i].UUID] = append(byUUID[rows[i].UUID], &rows[i])
		}
	}
	var out []GPUView
	for i := range snap.Devices {
		d := &snap.Devices[i]
		if !d.ExportsMemory() || !d.HasMemory {
			continue
		}
		g := GPUView{GPU: d.GPULabel(), UUID: d.UUID, Name: d.Name, Total: d.Memory.Total,
			Free: d.Memory.Free, DriverReserved: d.Memory.Reserved, Unattributed: d.Unattributed()}
		for _, r := range byUUID[d.UUID] {
			pv := ProcessView{PID: r.PID, Used: r.NVML.UsedBytes,
				Comm: r.Comm, Namespace: r.Info.Namespace, Pod: r.Info.Pod, Container: r.Info.Container}
			if ctx, ok := r.Context(); ok {
				a := r.Alloc
				pv.Reports = true
				pv.Framework = r.Framework
				pv.Reserved = a.Reserved
				pv.Context = ctx
				pv.Active = a.Active.V
				pv.Inactive = a.Inactive()
				if !a.Active.OK {
					pv.Active = a.Reserved // no split known: count it active
				}
				g.Context += pv.Context
				g.Active += pv.Active
				g.Inactive += pv.Inactive
			} else {
				g.NoStats += pv.Used
			}
			g.Processes = append(g.Processes, pv)
		}
		out = append(out, g)
	}
	return out
}

func percent(v, total uint64) float64 {
	if total == 0 {
		return 0
	}
	return 100 * float64(v) / float64(total)
}

// FormatBytes prints a byte count in binary units, as nvidia-smi and
// PyTorch's messages do.
func FormatBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.2f %ciB", float64(b)/float64(div), "KMGTP"[exp])
}
