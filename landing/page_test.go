package landing

import (
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/oom"
)

var (
	tags       = regexp.MustCompile(`<[^>]*>`)
	spaces     = regexp.MustCompile(`\s+`)
	beforeStop = regexp.MustCompile(` ([.,])( |$)`)
)

// text is roughly what a reader sees of an HTML fragment: tags made
// spaces (they separate table cells), entities decoded, runs of white
// space made one space, none before a full stop or comma.
func text(fragment string) string {
	s := spaces.ReplaceAllString(html.UnescapeString(tags.ReplaceAllString(fragment, " ")), " ")
	return strings.TrimSpace(beforeStop.ReplaceAllString(s, "$1$2"))
}

// render serves the page of cfg and fails the test on any other status.
func render(t *testing.T, cfg Config) string {
	t.Helper()
	rec := serve(New(cfg), "/")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET / = %d, want 200; body: %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// between is the part of s from the first start to the following end.
func between(t *testing.T, s, start, end string) string {
	t.Helper()
	i := strings.Index(s, start)
	if i < 0 {
		t.Fatalf("the page lacks %q", start)
	}
	j := strings.Index(s[i:], end)
	if j < 0 {
		t.Fatalf("the page lacks %q after %q", end, start)
	}
	return s[i : i+j+len(end)]
}

// articles are the page's OOM reports in page order.
func articles(body string) []string {
	parts := strings.Split(body, `<article class="report">`)[1:]
	for i, p := range parts {
		parts[i] = p[:strings.Index(p, "</article>")]
	}
	return parts
}

var now = time.Date(2025, 6, 15, 14, 0, 0, 0, time.UTC)

func TestPageHasAViewport(t *testing.T) {
	body := render(t, Config{Name: "gpumem_exporter"})
	if !strings.Contains(body, `<meta name="viewport" content="width=device-width, initial-scale=1">`) {
		t.Error("the page lacks the viewport meta: phones lay it out 980 px wide and shrink it")
	}
}

func TestPageShowsVersionAndRevision(t *testing.T) {
	for _, tc := range []struct {
		name, version, revision, want string
	}{
		{"long hash shortened", "0.1.0-dev", "2c63bba1f0e4d5c6b7a8990011223344556677aa", "version 0.1.0-dev · revision 2c63bba1f0e4 · backend"},
		{"short revision whole", "v1.2.3", "abc1234", "version v1.2.3 · revision abc1234 · backend"},
		{"not a hash stays whole", "v1.2.3", "release-2025-06-15-hotfix", "revision release-2025-06-15-hotfix ·"},
		{"no revision", "v1.2.3", "", "version v1.2.3 · backend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := text(between(t, render(t, Config{Version: tc.version, Revision: tc.revision}), `<p class="meta">`, "</p>"))
			if !strings.Contains(got, tc.want) {
				t.Errorf("the header line reads %q, want it to contain %q", got, tc.want)
			}
		})
	}
}

func TestOOMReportsComeFirstWhileRecent(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ages         []time.Duration // of the reports, newest first
		above, below int             // reports above and below the GPUs
	}{
		{"none", nil, 0, 0},
		{"5 min old", []time.Duration{5 * time.Minute}, 1, 0},
		{"59 min old", []time.Duration{59 * time.Minute}, 1, 0},
		{"clock ahead", []time.Duration{-time.Minute}, 1, 0},
		{"61 min old", []time.Duration{61 * time.Minute}, 0, 1},
		{"recent and old", []time.Duration{10 * time.Minute, 3 * time.Hour, 80 * time.Hour}, 1, 2},
		{"only old", []time.Duration{3 * time.Hour, 80 * time.Hour}, 0, 2},
		{"many recent", []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute}, 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := richConfig(now)
			var reports fakeReports
			for i, a := range tc.ages {
				reports = append(reports, richReport(now.Add(-a), i%8, 0, GiB))
			}
			cfg.Reports = reports
			body := render(t, cfg)
			gpus := strings.Index(body, `<section id="gpus"`)
			bar := strings.Index(body, `class="bar"`)
			if gpus < 0 || bar < gpus {
				t.Fatalf("the page lacks the GPU section (at %d) or its bars (at %d)", gpus, bar)
			}
			above, below := body[:gpus], body[gpus:]
			if n := strings.Count(above, `<article class="report">`); n != tc.above {
				t.Errorf("%d reports above the GPUs, want %d", n, tc.above)
			}
			if n := strings.Count(below, `<article class="report">`); n != tc.below {
				t.Errorf("%d reports below the GPUs, want %d", n, tc.below)
			}
			if n := strings.Count(body, `<section id="oom"`); n != 1 {
				t.Errorf(`the page has %d sections with id="oom", want 1 (the nav links to it)`, n)
			}
			if got, want := strings.Contains(above, `<section id="oom"`), tc.above > 0; got != want {
				t.Errorf("the OOM section is above the GPUs: %v, want %v", got, want)
			}
			if tc.above > 0 && tc.below > 0 {
				want := fmt.Sprintf("%d earlier report", tc.below)
				if !strings.Contains(text(above), want) {
					t.Errorf("the recent reports do not point to the %s", want)
				}
			}
			if tc.ages == nil && !strings.Contains(below, "None reported.") {
				t.Error(`the page without reports lacks "None reported." after the GPUs`)
			}
			if strings.Contains(body, "<details") {
				t.Error("the page collapses something: the refresh every 5 s would close it again")
			}
		})
	}
}

func TestOOMReportShowsWhatHappened(t *testing.T) {
	rep := oom.Report{
		Time: now.Add(-12 * time.Minute), GPU: "3", UUID: uuid(3), PID: 4242, Comm: "python3",
		Namespace: "ml", Pod: "train-0", Container: "trainer",
		RequestedBytes: 916 * MiB, LimitBytes: ptr(uint64(80 * GiB)), FreeBytes: ptr(uint64(512 * MiB)),
		NVMLDelaySeconds: ptr(0.25),
		DeviceMemory:     &oom.DeviceMemory{TotalBytes: 100 * GiB, UsedBytes: 99 * GiB, FreeBytes: 448 * MiB, ReservedBytes: ptr(uint64(576 * MiB))},
		Totals: oom.Totals{ReservedBytes: 70 * GiB, ActiveBytes: 60 * GiB, InactiveBytes: 10 * GiB, ContextBytes: 2 * GiB,
			UnattributedBytes: ptr(uint64(3 * GiB))},
		Processes: []oom.Process{
			{PID: 4242, Comm: "python3", Namespace: "ml", Pod: "train-0", Container: "trainer", Reporting: true, NVMLListed: true,
				UsedBytes: ptr(uint64(71 * GiB)), ReservedBytes: ptr(uint64(70 * GiB)), ActiveBytes: ptr(uint64(60 * GiB)),
				InactiveBytes: ptr(uint64(10 * GiB)), ContextBytes: ptr(uint64(GiB))},
			{PID: 5151, Comm: "vllm", Namespace: "serve", Pod: "llm-0", NVMLListed: true, UsedBytes: ptr(uint64(25 * GiB))},
			{PID: 6161, Comm: "jax", ReservedBytes: ptr(uint64(3 * GiB))},
		},
		Verdict: diagnosis.Verdict{Cause: diagnosis.Neighbours, Contributing: []diagnosis.Cause{diagnosis.Growth, diagnosis.Contexts},
			Summary: "The GPU had 512.00 MiB free, 404.00 MiB short of the request of 916.00 MiB.",
			Remedy:  "Other processes hold the GPU."},
	}
	cfg := Config{Reports: fakeReports{rep}, Now: func() time.Time { return now }}
	arts := articles(render(t, cfg))
	if len(arts) != 1 {
		t.Fatalf("the page shows %d reports, want 1", len(arts))
	}
	got := text(arts[0])
	for _, want := range []string{
		"GPU 3 · 2025-06-15 13:48:00 UTC · 12 min ago",
		"pid 4242 python3 (ml/train-0/trainer) on " + uuid(3) + " tried to allocate 916.00 MiB.",
		// One sentence that says why, above the figures.
		"Why: neighbours (also: growth, contexts). The GPU had 512.00 MiB free, 404.00 MiB short of the request of 916.00 MiB. First: Other processes hold the GPU. requested 916.00 MiB",
		"requested 916.00 MiB",
		"limit 80.00 GiB",
		"free 512.00 MiB",
		"NVML free 448.00 MiB",
		"NVML total 100.00 GiB",
		"driver reserved 576.00 MiB",
		"reserved 70.00 GiB active 60.00 GiB inactive 10.00 GiB context 2.00 GiB unattributed 3.00 GiB",
		"NVML read at +0.2 s",
		"pid top holders used reserved active inactive context",
		"4242 python3 (ml/train-0/trainer) reported the OOM 71.00 GiB 70.00 GiB 60.00 GiB 10.00 GiB 1.00 GiB",
		"5151 vllm (serve/llm-0) 25.00 GiB — — — —",
		"6161 jax — 3.00 GiB — — —",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q; it reads:\n%s", want, got)
		}
	}
	if strings.Count(arts[0], `class="reporter"`) != 1 {
		t.Error("the reporting process's row is not marked, or more than one is")
	}
}

func TestOOMReportWithoutOptionalFigures(t *testing.T) {
	rep := oom.Report{Time: now.Add(-time.Minute), UUID: uuid(9), PID: 7, RequestedBytes: 2 * MiB, Processes: []oom.Process{}}
	arts := articles(render(t, Config{Reports: fakeReports{rep}, Now: func() time.Time { return now }}))
	if len(arts) != 1 {
		t.Fatalf("the page shows %d reports, want 1", len(arts))
	}
	got := text(arts[0])
	for _, want := range []string{"GPU ? ·", "limit — free —", "No process was listed on the device at the time."} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q; it reads:\n%s", want, got)
		}
	}
	for _, absent := range []string{"NVML free", "driver reserved", "unattributed", "NVML read at"} {
		if strings.Contains(got, absent) {
			t.Errorf("the report shows %q though the report has no such figure; it reads:\n%s", absent, got)
		}
	}
}

func TestOOMReportsNewestFirst(t *testing.T) {
	// List promises newest first; the page sorts anyway.
	times := []time.Duration{30 * time.Minute, 2 * time.Minute, 5 * time.Hour, 20 * time.Minute, 90 * time.Minute}
	var reports fakeReports
	for i, a := range times {
		reports = append(reports, richReport(now.Add(-a), i, 0, GiB))
	}
	arts := articles(render(t, Config{Reports: reports, Now: func() time.Time { return now }}))
	want := []string{"GPU 1 ·", "GPU 3 ·", "GPU 0 ·", "GPU 4 ·", "GPU 2 ·"}
	if len(arts) != len(want) {
		t.Fatalf("the page shows %d reports, want %d", len(arts), len(want))
	}
	for i, w := range want {
		if got := text(arts[i]); !strings.HasPrefix(got, w) {
			t.Errorf("report %d starts %.40q, want %q (newest first)", i, got, w)
		}
	}
	if reports[0].GPU != "0" {
		t.Error("the page reordered the shared list it was given")
	}
}

func TestOOMReportListsTheTopHoldersAndTheReporter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reporter int // position among the nine holders, largest first
		pids     []string
		more     string
	}{
		{"reporter among the top five", 2, []string{"200300", "200301", "200302", "200303", "200304"}, "and 4 more processes in the JSON."},
		{"reporter further down", 8, []string{"200300", "200301", "200302", "200303", "200304", "200308"}, "and 3 more processes in the JSON."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arts := articles(render(t, Config{Reports: fakeReports{richReport(now, 3, tc.reporter, GiB)}, Now: func() time.Time { return now }}))
			if len(arts) != 1 {
				t.Fatalf("the page shows %d reports, want 1", len(arts))
			}
			rows := strings.Split(between(t, arts[0], "<tbody>", "</tbody>"), "<tr")[1:]
			var pids []string
			for _, r := range rows {
				pids = append(pids, strings.Fields(text("<tr" + r))[0])
			}
			if strings.Join(pids, " ") != strings.Join(tc.pids, " ") {
				t.Errorf("holders listed: %v, want %v", pids, tc.pids)
			}
			if !strings.Contains(text(arts[0]), tc.more) {
				t.Errorf("the report lacks %q", tc.more)
			}
		})
	}
}

func TestPageEscapesNamesFromProcessesAndPods(t *testing.T) {
	// Any local user names their process; pod names come from the API.
	const (
		comm      = `<script>alert(1)</script>`
		namespace = `ns"onmouseover="alert(2)`
		pod       = `"><img src=x onerror=alert(3)>`
		container = `</td></tr></table><h1>x</h1>`
	)
	cfg := richConfig(now)
	names := cfg.Sources.Workload.(fixedLookup)
	for pid, in := range names {
		in.Comm, in.Namespace, in.Pod, in.Container = comm, namespace, pod, container
		names[pid] = in
	}
	rep := richReport(now.Add(-time.Minute), 0, 1, GiB)
	rep.Comm, rep.Namespace, rep.Pod, rep.Container = comm, namespace, pod, container
	for i := range rep.Processes {
		rep.Processes[i].Comm, rep.Processes[i].Namespace, rep.Processes[i].Pod, rep.Processes[i].Container = comm, namespace, pod, container
	}
	cfg.Reports = fakeReports{rep}
	body := render(t, cfg)
	for _, raw := range []string{comm, pod, container, `"onmouseover=`, "<img", "<h1>x"} {
		if strings.Contains(body, raw) {
			t.Errorf("the page contains %q unescaped", raw)
		}
	}
	escaped := "&lt;script&gt;alert(1)&lt;/script&gt;"
	if n := strings.Count(body, escaped); n != 8*9+5+1 {
		t.Errorf("the escaped process name appears %d times, want once per process row (72), holder row (5) and report (1)", n)
	}
	if n := strings.Count(body, "<script"); n != 0 {
		t.Errorf("the page has %d script elements, want none", n)
	}
}

func TestAge(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-5 * time.Second, "just now"},
		{0, "0 s ago"},
		{59 * time.Second, "59 s ago"},
		{time.Minute, "1 min ago"},
		{59*time.Minute + 59*time.Second, "59 min ago"},
		{time.Hour, "1 h ago"},
		{47 * time.Hour, "47 h ago"},
		{48 * time.Hour, "2 days ago"},
		{400 * 24 * time.Hour, "400 days ago"},
	} {
		if got := age(tc.d); got != tc.want {
			t.Errorf("age(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
