package landing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// layoutWidths are the viewport widths the page must read well at: a small
// phone, a tablet, the narrowest table layout (the card layout for process
// tables ends at 959 px), and a wide screen.
var layoutWidths = []int{400, 800, 960, 1600}

// layoutScript measures each framed copy of the page and writes the results
// as JSON into <pre id="layout-result">, which --dump-dom returns. Per
// frame: the document's width and scroll width, every .num that takes more
// than one line or spills out of its box, every element that reaches past
// the viewport or whose content spills out of it, and where the OOM
// section and the first GPU bar start.
const layoutScript = `
function describe(el) {
  let s = el.tagName.toLowerCase();
  if (el.id) s += '#' + el.id;
  if (typeof el.className === 'string' && el.className) s += '.' + el.className.trim().split(/\s+/).join('.');
  return s + ' "' + el.textContent.trim().replace(/\s+/g, ' ').slice(0, 50) + '"';
}
function measure(frame) {
  const doc = frame.contentDocument, win = frame.contentWindow, root = doc.documentElement;
  const width = root.clientWidth;
  const r = {width: frame.width | 0, clientWidth: width, scrollWidth: root.scrollWidth,
    cards: win.matchMedia('(max-width: 959px)').matches, nums: 0, wrapped: [], outside: [], spilling: []};
  for (const el of doc.querySelectorAll('.num')) {
    if (el.closest('details:not([open])')) continue;
    r.nums++;
    if (el.getClientRects().length !== 1) r.wrapped.push(describe(el));
    const box = el.getBoundingClientRect();
    const outer = el.parentElement.closest('td, th, div, p, h3, dl').getBoundingClientRect();
    if (box.left < outer.left - 1 || box.right > outer.right + 1) r.outside.push(describe(el) + ' in ' + describe(el.parentElement));
  }
  for (const el of doc.body.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    if (box.left < -1 || box.right > width + 1) r.outside.push(describe(el) + ' spans ' + Math.round(box.left) + '..' + Math.round(box.right));
    if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) r.spilling.push(describe(el) + ' scrollWidth ' + el.scrollWidth + ' > ' + el.clientWidth);
  }
  const top = sel => { const el = doc.querySelector(sel); return el ? el.getBoundingClientRect().top + win.scrollY : -1; };
  r.oomTop = top('#oom'); r.firstBarTop = top('.bar');
  return r;
}
window.addEventListener('load', () => {
  const out = Array.from(document.querySelectorAll('iframe'), measure);
  document.getElementById('layout-result').textContent = JSON.stringify(out);
});
`

type layoutResult struct {
	Width, ClientWidth, ScrollWidth int
	Cards                           bool // the narrow-screen card layout applies
	Nums                            int
	Wrapped, Outside, Spilling      []string
	OOMTop, FirstBarTop             float64
}

// TestPageLayoutInChromium renders a busy node (eight GPUs, nine
// processes each with long pod names, two of them with a time to OOM, four
// OOM reports, two of them
// recent) and lays it out in headless Chromium at each of layoutWidths: no
// horizontal scrolling, no number split over two lines or out of its cell,
// and the recent OOM reports on the first screen, above the GPUs.
//
// Headless Chromium will not make a window narrower than 500 px, so the
// page is laid out in iframes of the widths under test, each its own
// viewport (media queries included), measured by a script in the framing
// page. Desktop Chromium ignores the viewport meta either way;
// TestPageHasAViewport checks it.
func TestPageLayoutInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed, so the page's layout at 400 to 1600 px is not checked; " +
			"install it with: apt-get install -y --no-install-recommends chromium (.ci/run does)")
	}
	start := time.Now()
	page := render(t, richConfig(now))
	if !strings.Contains(page, "averyveryverylongprocessname") || strings.Count(page, `class="bar"`) != 8 {
		t.Fatal("the fixture did not render eight GPUs with the long process name")
	}

	var harness bytes.Buffer
	harness.WriteString("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>layout</title></head><body style=\"margin:0\">\n")
	for _, w := range layoutWidths {
		// srcdoc keeps the frames same-origin with the harness, so its
		// script can measure them.
		fmt.Fprintf(&harness, "<iframe width=\"%d\" height=\"900\" style=\"border:0;display:block\" srcdoc=\"%s\"></iframe>\n", w, html.EscapeString(page))
	}
	harness.WriteString("<pre id=\"layout-result\"></pre>\n<script>" + layoutScript + "</script>\n</body></html>\n")
	dir := t.TempDir()
	file := filepath.Join(dir, "layout.html")
	if err := os.WriteFile(file, harness.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
		"--no-first-run", "--user-data-dir="+filepath.Join(dir, "profile"),
		"--window-size=1700,1000", "--virtual-time-budget=2000", "--dump-dom", "file://"+file)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstderr (tail):\n%s", cmd, err, tail(stderr.String(), 2000))
	}
	results := parseLayoutResult(t, stdout.String(), stderr.String())
	t.Logf("Chromium laid out the page at %v px in %s", layoutWidths, time.Since(start).Round(10*time.Millisecond))

	if len(results) != len(layoutWidths) {
		t.Fatalf("measured %d frames, want %d", len(results), len(layoutWidths))
	}
	for i, r := range results {
		t.Run(fmt.Sprintf("%dpx", layoutWidths[i]), func(t *testing.T) {
			if r.Width != layoutWidths[i] {
				t.Fatalf("frame %d is %d px wide, want %d", i, r.Width, layoutWidths[i])
			}
			if r.ScrollWidth > r.ClientWidth {
				t.Errorf("the page scrolls sideways: %d px of content in %d px", r.ScrollWidth, r.ClientWidth)
			}
			if wantCards := r.Width < 960; r.Cards != wantCards {
				t.Errorf("card layout for the process tables: %v, want %v", r.Cards, wantCards)
			}
			// Per GPU: 6 processes with 4 numbers, 3 with 1, 2 times to
			// OOM and 8 figures; the 2 open reports' 12 figures each and 11
			// holder rows of 5.
			if r.Nums < 8*(6*4+3*1+2+8)+2*12+11*5 {
				t.Errorf("measured %d numbers, want every number on the page", r.Nums)
			}
			for what, list := range map[string][]string{
				"numbers over two lines":                      r.Wrapped,
				"elements outside the viewport or their cell": r.Outside,
				"elements whose content spills out":           r.Spilling,
			} {
				if len(list) > 0 {
					t.Errorf("%d %s, such as:\n  %s", len(list), what, strings.Join(list[:min(len(list), 10)], "\n  "))
				}
			}
			if r.OOMTop < 0 || r.FirstBarTop < 0 {
				t.Fatalf("the page lacks the OOM section (top %v) or a GPU bar (top %v)", r.OOMTop, r.FirstBarTop)
			}
			if r.OOMTop > r.FirstBarTop || r.OOMTop > 900 {
				t.Errorf("the recent OOM reports start %v px down, the first GPU bar %v px: want them first, on the first 900 px", r.OOMTop, r.FirstBarTop)
			}
		})
	}
}

func parseLayoutResult(t *testing.T, dom, stderr string) []layoutResult {
	t.Helper()
	const open, end = `<pre id="layout-result">`, "</pre>"
	i := strings.Index(dom, open)
	if i < 0 {
		t.Fatalf("Chromium's DOM lacks the result element; stdout (tail):\n%s\nstderr (tail):\n%s", tail(dom, 2000), tail(stderr, 2000))
	}
	raw := dom[i+len(open):]
	raw = html.UnescapeString(raw[:strings.Index(raw, end)])
	if raw == "" {
		t.Fatalf("the layout script wrote no result (a script error?); stderr (tail):\n%s", tail(stderr, 2000))
	}
	var results []layoutResult
	if err := json.Unmarshal([]byte(raw), &results); err != nil {
		t.Fatalf("decoding the layout result %q: %v", raw, err)
	}
	return results
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
