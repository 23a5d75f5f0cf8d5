package attack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// HTTP starvation: one client on loopback, with no credentials, tries to
// keep Prometheus's scrape and the kubelet's probes from being served. The
// scraper keeps its connection alive between scrapes, as Prometheus does;
// the prober opens a new connection for each probe, as the kubelet does.
//
// GPUMEM_ATTACK_HTTP_DURATION (default 6s) and GPUMEM_ATTACK_HTTP_INTERVAL
// (default 1s, the scrape and probe period) make a run longer, as for the
// figures of docs/security.md:
//
//	GPUMEM_ATTACK_HTTP_DURATION=60s GPUMEM_ATTACK_HTTP_INTERVAL=15s go test -count=1 -run HTTPStarvation -v ./attack/

// httpAttacks are what the attacker sends on each of its connections.
var httpAttacks = []struct {
	name    string
	payload string
}{
	{"connect flood", ""},
	{"partial header", "GET /metrics HTTP/1.1\r\nHost: gpumem\r\nUser-Agent: slow"},
	{"unsent body", "GET /metrics HTTP/1.1\r\nHost: gpumem\r\nContent-Length: 1000\r\n\r\n"},
}

const (
	// floodWorkers open connections in a loop, each to one port.
	floodWorkers = 2
	// floodHeld is how many of its latest connections a worker keeps
	// open; it closes the oldest as it opens a new one.
	floodHeld = 256
	// The kubelet's verdicts with the chart's probes: liveness fails a
	// probe not answered within 5 s (and restarts the exporter after 3),
	// readiness one not answered within 1 s (and drops the endpoint after
	// 3 in a row).
	livenessTimeout   = 5 * time.Second
	readinessTimeout  = time.Second
	readinessFailures = 3
	livenessFailures  = 3
)

// TestSecurityHTTPStarvation: while one client floods the metrics port and
// the health port with connections that send nothing, half a header, or
// a header whose body never comes, every scrape is served, and the probes
// in time for the kubelet: never livenessFailures in a row past the
// liveness timeout, never readinessFailures in a row past the readiness
// timeout. (A probe opens a
// new connection, which waits in the kernel's accept queue behind the
// flood's; on a loaded machine that wait alone can pass a second. The
// readiness check is left out against an exporter built with the race
// detector, which multiplies what each connection costs it.)
func TestSecurityHTTPStarvation(t *testing.T) {
	_, race := exporterBinary(t)
	duration := envDuration(t, "GPUMEM_ATTACK_HTTP_DURATION", 6*time.Second)
	interval := envDuration(t, "GPUMEM_ATTACK_HTTP_INTERVAL", time.Second)
	for _, auth := range []bool{false, true} {
		var args []string
		user, pass := "", ""
		if auth {
			user, pass = "prometheus", "scrape-secret"
			args = append(args, "--web.config.file="+basicAuthConfig(t, user, pass))
		}
		health, err := exportertest.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		e := startExporter(t, append(args, "--web.max-connections=64", "--web.health-address="+health)...)
		e.User, e.Pass = user, pass
		e.WaitReady(t)
		for _, a := range httpAttacks {
			name := a.name
			if auth {
				name += " with basic auth"
			}
			t.Run(name, func(t *testing.T) {
				// Prometheus was scraping before the attack began: its
				// credentials are checked (bcrypt) and cached already.
				scraper := &httpVictim{url: "http://" + e.Addr + "/metrics", want: "gpumem_gpu_info", user: user, pass: pass,
					client: &http.Client{Timeout: min(max(interval, 2*time.Second), 10*time.Second), Transport: &http.Transport{}}}
				prober := &httpVictim{url: "http://" + health + "/-/ready", want: "Ready", late: readinessTimeout,
					client: &http.Client{Timeout: livenessTimeout, Transport: &http.Transport{DisableKeepAlives: true}}}
				if err := scraper.once(); err != nil {
					t.Fatalf("scrape before the attack: %v", err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), duration)
				defer cancel()
				var opened atomic.Int64
				var wg sync.WaitGroup
				for _, addr := range []string{e.Addr, health} {
					for range floodWorkers {
						wg.Add(1)
						go func() { defer wg.Done(); flood(ctx, addr, a.payload, &opened) }()
					}
				}
				time.Sleep(200 * time.Millisecond) // the flood is under way
				wg.Add(2)
				go func() { defer wg.Done(); scraper.every(ctx, interval) }()
				go func() { defer wg.Done(); prober.every(ctx, interval) }()
				wg.Wait()
				t.Logf("%s: %d connections in %s (%.0f/s); scrapes: %s; probes: %s",
					name, opened.Load(), duration, float64(opened.Load())/duration.Seconds(), scraper, prober)
				if scraper.failed > 0 || scraper.ok == 0 {
					t.Errorf("%d of %d scrapes failed under the %s attack: %s", scraper.failed, scraper.ok+scraper.failed, a.name, strings.Join(scraper.errs, "; "))
				}
				// The kubelet restarts a container after livenessFailures
				// failed probes in a row: one probe past its timeout on a
				// loaded machine (the test binaries of make test run
				// beside this one) is what the kubelet tolerates too.
				if prober.failRun >= livenessFailures || prober.ok == 0 {
					t.Errorf("%d of %d probes failed under the %s attack (%d in a row): %s", prober.failed, prober.ok+prober.failed, a.name, prober.failRun, strings.Join(prober.errs, "; "))
				}
				if prober.lateRun >= readinessFailures && !race {
					t.Errorf("%d probes in a row took over %s under the %s attack: the kubelet would mark the exporter unready", prober.lateRun, readinessTimeout, a.name)
				}
				if n := e.FDs(t); n > 64+8+128 {
					t.Errorf("the exporter holds %d descriptors after the attack, want at most the HTTP caps (64 + 8) and its own", n)
				}
			})
		}
	}
}

// flood opens connections to addr as fast as it can until ctx ends, sends
// payload on each and never anything more, and keeps its floodHeld latest
// connections open.
func flood(ctx context.Context, addr, payload string, opened *atomic.Int64) {
	held := make([]net.Conn, floodHeld)
	defer func() {
		for _, c := range held {
			if c != nil {
				c.Close()
			}
		}
	}()
	d := net.Dialer{Timeout: time.Second}
	for i := 0; ctx.Err() == nil; i++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			time.Sleep(time.Millisecond) // out of ports or descriptors for a moment
			continue
		}
		if payload != "" {
			c.Write([]byte(payload))
		}
		opened.Add(1)
		slot := i % floodHeld
		if held[slot] != nil {
			held[slot].Close()
		}
		held[slot] = c
	}
}

// httpVictim is Prometheus's scrape or the kubelet's probe: a GET every
// interval that must answer 200 with want in its body within the client's
// timeout.
type httpVictim struct {
	url, want  string
	user, pass string
	client     *http.Client
	late       time.Duration // served later than this counts as late; 0: none

	ok, failed int
	lates, run int // served late; late or failed in a row now
	lateRun    int // the longest such run
	fails      int // failed in a row now
	failRun    int // the longest such run
	slowest    time.Duration
	errs       []string
}

func (v *httpVictim) every(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		start := time.Now()
		err := v.once()
		took := time.Since(start)
		if err != nil {
			v.failed++
			v.fails++
			v.failRun = max(v.failRun, v.fails)
			if len(v.errs) < 5 {
				v.errs = append(v.errs, err.Error())
			}
		} else {
			v.ok++
			v.fails = 0
			v.slowest = max(v.slowest, took)
		}
		if v.late > 0 && err == nil && took > v.late {
			v.lates++
		}
		if err != nil || (v.late > 0 && took > v.late) {
			v.run++
			v.lateRun = max(v.lateRun, v.run)
		} else {
			v.run = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (v *httpVictim) once() error {
	req, err := http.NewRequest("GET", v.url, nil)
	if err != nil {
		return err
	}
	if v.user != "" {
		req.SetBasicAuth(v.user, v.pass)
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), v.want) {
		return fmt.Errorf("%s: status %d", v.url, resp.StatusCode)
	}
	return nil
}

func (v *httpVictim) String() string {
	s := fmt.Sprintf("%d of %d failed", v.failed, v.ok+v.failed)
	if v.late > 0 {
		s += fmt.Sprintf(", %d served after %s (at most %d in a row with failures)", v.lates, v.late, v.lateRun)
	}
	return s + fmt.Sprintf(", slowest served in %s", v.slowest.Round(time.Millisecond))
}

// basicAuthConfig writes a --web.config.file that admits user with pass.
func basicAuthConfig(t *testing.T, user, pass string) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(path, fmt.Appendf(nil, "basic_auth_users:\n  %s: %s\n", user, hash), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 60s", name, s)
	}
	return d
}
