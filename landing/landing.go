// Package landing serves the exporter's landing page: what runs, links, and
// a live picture of each GPU's memory split into context, active, inactive,
// unattributed and free, with the daemon's estimate of when each climbing
// process runs out of memory, and the last out-of-memory reports. The newest
// reports, if under an hour old, come first, above the GPUs; the others
// follow the GPUs. It is one server-rendered page without scripts or
// external assets, laid out for screens from 400 px wide up.
package landing

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"time"

	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/foresight"
	"github.com/gpumem/gpumem_exporter/oom"
)

//go:embed page.html
var files embed.FS

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"bytes":    FormatBytes,
	"optbytes": optBytes,
	"pct":      func(v, total uint64) string { return fmt.Sprintf("%.3f", percent(v, total)) },
	"short":    shortRevision,
	"seconds":  func(s float64) string { return fmt.Sprintf("%+.1f s", s) },
	"within":   foresight.Duration,
	"eta":      eta,
}).ParseFS(files, "page.html"))

// Config is what the page shows.
type Config struct {
	Name, Version, Revision, MetricsPath, Backend, Socket string
	// Sources is the join the page reads, the same as /metrics. Its
	// Forecasts give each row's time to OOM.
	Sources attribution.Sources
	// Forecasts, if set, say what climbs in a process whose row has a time
	// to OOM (foresight.Forecaster).
	Forecasts Forecasts
	// WarnBefore is the daemon's warning threshold: a time to OOM under it
	// shows as a warning (foresight.DefaultWarnBefore when 0; negative:
	// the daemon sends no warnings).
	WarnBefore time.Duration
	NVMLUp     func() bool
	// Reports lists the OOM reports, newest first.
	Reports interface{ List() []oom.Report }
	// Now is the clock that dates the reports (time.Now when nil).
	Now func() time.Time
}

// Forecasts give the daemon's last forecast of a process: its cause.
type Forecasts interface {
	Forecast(k diagnosis.Key) (diagnosis.Forecast, bool)
}

// RecentOOM is how long an OOM report counts as recent: while one is, the
// reports come first on the page.
const RecentOOM = time.Hour

const (
	// firstReports is how many recent reports come before the GPUs; the
	// others follow them.
	firstReports = 2
	// topHolders is how many processes a report lists, largest first
	// (the reporting process is added when it is not among them).
	topHolders = 5
)

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

// Usable is the memory processes can have: Total less what the driver
// reserves. PyTorch's out-of-memory error calls it the GPU's "total
// capacity", and the OOM verdicts reckon with it.
func (g GPUView) Usable() uint64 {
	if g.DriverReserved >= g.Total {
		return 0
	}
	return g.Total - g.DriverReserved
}

// ProcessView is one process row under a GPU.
type ProcessView struct {
	PID                                 uint32
	Used                                uint64
	Reports                             bool
	Context, Active, Inactive, Reserved uint64
	Framework                           string
	Comm, Namespace, Pod, Container     string // when known
	// Foreseen is the daemon's estimate of when the process runs out of
	// memory; nil while no climb is measured.
	Foreseen *Foresight
}

// Foresight is the daemon's estimate of when a process runs out of memory
// at the current climb of its active memory (Row.TimeToOOM).
type Foresight struct {
	// In is how long until it runs out.
	In time.Duration
	// Cause is what climbs: diagnosis.Leak (the floor of active memory)
	// or diagnosis.Growth (each step's peak); "" when not known.
	Cause diagnosis.Cause
	// Warned says In is under the daemon's warning threshold: the daemon
	// has warned the process over its socket connection.
	Warned bool
}

// OOMSection is the page's list of out-of-memory reports.
type OOMSection struct {
	// First are the newest reports younger than RecentOOM, at most
	// firstReports, shown above the GPUs; Later are the others, below
	// them. Both are newest first.
	First, Later []ReportView
	Total        int
}

// ReportView is one OOM report as the page shows it.
type ReportView struct {
	oom.Report
	Age string // "12 min ago"
	// Holders are the largest processes on the device at the time, and the
	// reporting one; MoreHolders how many others the report has.
	Holders     []oom.Process
	MoreHolders int
}

type data struct {
	Config
	Up bool
	// Warn is the daemon's warning threshold in effect; negative: none.
	Warn time.Duration
	GPUs []GPUView
	OOM  OOMSection
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
	d.Warn = h.cfg.WarnBefore
	if d.Warn == 0 {
		d.Warn = foresight.DefaultWarnBefore
	}
	d.GPUs = Split(h.cfg.Sources.Read(), h.cfg.Forecasts, d.Warn)
	now := time.Now
	if h.cfg.Now != nil {
		now = h.cfg.Now
	}
	if h.cfg.Reports != nil {
		d.OOM = OOMReports(h.cfg.Reports.List(), now())
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
// that does not counts whole under NoStats. A row's time to OOM becomes
// its Foreseen, with its cause from forecasts (which may be nil), warned
// under warnBefore (negative: never). It reads the same join as the
// collectors, so that the page and /metrics agree.
func Split(v attribution.View, forecasts Forecasts, warnBefore time.Duration) []GPUView {
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
			pv.Foreseen = foreseen(r, forecasts, warnBefore)
			g.Processes = append(g.Processes, pv)
		}
		out = append(out, g)
	}
	return out
}

// foreseen is r's time to OOM as the page shows it; nil when unknown.
func foreseen(r *attribution.Row, forecasts Forecasts, warnBefore time.Duration) *Foresight {
	if !r.TimeToOOM.OK {
		return nil
	}
	f := &Foresight{In: time.Duration(r.TimeToOOM.V) * time.Second}
	f.Warned = warnBefore > 0 && f.In < warnBefore
	if forecasts != nil {
		if fc, ok := forecasts.Forecast(r.DiagnosisKey()); ok {
			f.Cause = fc.Cause
		}
	}
	return f
}

// OOMReports arranges OOM reports for the page: newest first, the newest
// of those younger than RecentOOM at now first.
func OOMReports(list []oom.Report, now time.Time) OOMSection {
	reports := make([]oom.Report, len(list))
	copy(reports, list) // the list is shared: sort a copy
	sort.SliceStable(reports, func(i, j int) bool { return reports[i].Time.After(reports[j].Time) })
	s := OOMSection{Total: len(reports)}
	for i := range reports {
		v := reportView(&reports[i], now)
		if len(s.Later) == 0 && len(s.First) < firstReports && now.Sub(reports[i].Time) < RecentOOM {
			s.First = append(s.First, v)
		} else {
			s.Later = append(s.Later, v)
		}
	}
	return s
}

func reportView(r *oom.Report, now time.Time) ReportView {
	v := ReportView{Report: *r, Age: age(now.Sub(r.Time))}
	n := min(topHolders, len(r.Processes))
	v.Holders = append(v.Holders, r.Processes[:n]...)
	for _, p := range r.Processes[n:] {
		if p.Reporting {
			v.Holders = append(v.Holders, p)
			break
		}
	}
	v.MoreHolders = len(r.Processes) - len(v.Holders)
	return v
}

// age says how long ago something happened, in the largest whole unit.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "just now" // the reporting clock runs ahead of ours
	case d < time.Minute:
		return fmt.Sprintf("%d s ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d/time.Hour))
	default:
		return fmt.Sprintf("%d days ago", int(d/(24*time.Hour)))
	}
}

// eta says when something happens: "in about 3 minutes", "now".
func eta(d time.Duration) string {
	if d < time.Second {
		return "now"
	}
	return "in about " + foresight.Duration(d)
}

// optBytes prints an optional byte count; "—" when it was not reported.
func optBytes(b *uint64) string {
	if b == nil {
		return "—"
	}
	return FormatBytes(*b)
}

// shortRevision shortens a commit hash as git log --oneline does, a little
// longer; anything that is not a long hex string stays whole.
func shortRevision(rev string) string {
	const n = 12
	if len(rev) <= n {
		return rev
	}
	for _, c := range rev {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return rev
		}
	}
	return rev[:n]
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
