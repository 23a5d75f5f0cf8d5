package attack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// Password spray on basic auth: one client with no valid credentials sends
// request after request, each with a new random password, and closes its
// connection as soon as the request is sent. Prometheus (credentials
// checked before the spray began) scrapes every interval on a kept-alive
// connection, the kubelet probes the health port.
//
// GPUMEM_ATTACK_SPRAY_DURATION (default 12s), GPUMEM_ATTACK_SPRAY_INTERVAL
// (default 1s) and GPUMEM_ATTACK_SPRAY_RATE (requests a second, default
// 150: a Python loop's rate) make a run longer, as for the figures of
// docs/security.md:
//
//	GPUMEM_ATTACK_SPRAY_DURATION=150s GPUMEM_ATTACK_SPRAY_INTERVAL=5s go test -count=1 -run PasswordSpray -v ./attack/

// TestSecurityPasswordSpray: under the spray at most one scrape in twelve
// fails, probes are answered in time, peak RSS stays under the DaemonSet's
// memory request (checked without the race detector), and once the spray
// stops nothing is left queued: the next scrape is served at once and the
// exporter goes back to idle (within 0.4 s of CPU of what it used in 2 s
// before the spray).
func TestSecurityPasswordSpray(t *testing.T) {
	_, race := exporterBinary(t)
	duration := envDuration(t, "GPUMEM_ATTACK_SPRAY_DURATION", 12*time.Second)
	interval := envDuration(t, "GPUMEM_ATTACK_SPRAY_INTERVAL", time.Second)
	rate := 150
	if s := os.Getenv("GPUMEM_ATTACK_SPRAY_RATE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("GPUMEM_ATTACK_SPRAY_RATE=%q: want a positive number of requests a second", s)
		}
		rate = n
	}
	user, pass := "prometheus", "scrape-secret"
	health, err := exportertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	e := startExporter(t, "--web.config.file="+basicAuthConfig(t, user, pass), "--web.health-address="+health)
	e.User, e.Pass = user, pass
	e.WaitReady(t)
	pid := e.Pid()

	scraper := &httpVictim{url: "http://" + e.Addr + "/metrics", want: "gpumem_gpu_info", user: user, pass: pass,
		client: &http.Client{Timeout: min(max(interval, 2*time.Second), 10*time.Second), Transport: &http.Transport{}}}
	prober := &httpVictim{url: "http://" + health + "/-/ready", want: "Ready", late: readinessTimeout,
		client: &http.Client{Timeout: livenessTimeout, Transport: &http.Transport{DisableKeepAlives: true}}}
	if err := scraper.once(); err != nil {
		t.Fatalf("scrape before the spray: %v", err)
	}
	// What the exporter uses in 2 s without the spray (its polls; more
	// with the race detector), to compare with the 2 s after it.
	idleStart := procCPU(t, pid)
	time.Sleep(2 * time.Second)
	idle := procCPU(t, pid) - idleStart

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var sent atomic.Int64
	var peak atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); spray(ctx, e.Addr, user, rate, &sent) }()
	go func() { defer wg.Done(); peakRSS(ctx, pid, &peak) }()
	time.Sleep(200 * time.Millisecond) // the spray is under way
	go func() { defer wg.Done(); scraper.every(ctx, interval) }()
	go func() { defer wg.Done(); prober.every(ctx, interval) }()
	wg.Wait()
	stopped := time.Now()

	// Nothing queued: the next scrape is served at once, and in the two
	// seconds after it the exporter is close to idle.
	after := &httpVictim{url: scraper.url, want: scraper.want, user: user, pass: pass, client: &http.Client{Timeout: 5 * time.Second}}
	afterErr := after.once()
	afterTook := time.Since(stopped)
	cpuBefore := procCPU(t, pid)
	time.Sleep(2 * time.Second)
	cpuAfter := procCPU(t, pid) - cpuBefore
	peak.Store(max(peak.Load(), procStatusBytes(t, pid, "VmRSS")))

	t.Logf("%d spray requests in %s (%.0f/s); scrapes: %s; probes: %s; first scrape after the spray %s (err %v); CPU in the 2 s after it %s (idle %s); peak RSS %.1f MiB (race detector %v)",
		sent.Load(), duration, float64(sent.Load())/duration.Seconds(), scraper, prober,
		afterTook.Round(time.Millisecond), afterErr, cpuAfter.Round(time.Millisecond), idle.Round(time.Millisecond), float64(peak.Load())/(1<<20), race)
	if total := scraper.ok + scraper.failed; total == 0 || scraper.failed*12 > total {
		t.Errorf("%d of %d scrapes failed under the spray, want at most one in twelve: %s", scraper.failed, total, strings.Join(scraper.errs, "; "))
	}
	if prober.failRun >= livenessFailures || prober.ok == 0 {
		t.Errorf("%d of %d probes failed under the spray (%d in a row): %s", prober.failed, prober.ok+prober.failed, prober.failRun, strings.Join(prober.errs, "; "))
	}
	if prober.lateRun >= readinessFailures && !race {
		t.Errorf("%d probes in a row took over %s under the spray: the kubelet would mark the exporter unready", prober.lateRun, readinessTimeout)
	}
	if afterErr != nil || afterTook > 2*time.Second {
		t.Errorf("the first scrape after the spray took %s (err %v): requests of the spray are still queued", afterTook, afterErr)
	}
	if cpuAfter > idle+400*time.Millisecond {
		t.Errorf("the exporter used %s of CPU in the 2 s after the spray stopped (%s when idle): it is still checking the spray's passwords", cpuAfter, idle)
	}
	if !race && peak.Load() >= memoryRequest {
		t.Errorf("peak RSS %.1f MiB under the spray, want under the %d MiB request", float64(peak.Load())/(1<<20), memoryRequest>>20)
	}
}

// spray sends rate requests a second to addr until ctx ends, each on a new
// connection with user and a new random password, and closes each
// connection once its request is written, without reading the answer.
func spray(ctx context.Context, addr, user string, rate int, sent *atomic.Int64) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	d := net.Dialer{Timeout: time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			continue
		}
		guess := make([]byte, 12)
		rand.Read(guess)
		creds := base64.StdEncoding.EncodeToString([]byte(user + ":" + base64.RawURLEncoding.EncodeToString(guess)))
		fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: gpumem\r\nAuthorization: Basic %s\r\n\r\n", creds)
		c.Close()
		sent.Add(1)
	}
}

// peakRSS records the highest VmRSS of pid, read every 100 ms, until ctx
// ends. (VmHWM would count start-up, which the exporter gives back.)
func peakRSS(ctx context.Context, pid int, peak *atomic.Uint64) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if v, err := statusBytes(pid, "VmRSS"); err == nil && v > peak.Load() {
			peak.Store(v)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// procCPU is the CPU time pid has used, user and system.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	// utime and stime are fields 14 and 15; fields[0] is field 3.
	utime, _ := strconv.ParseUint(fields[14-3], 10, 64)
	stime, _ := strconv.ParseUint(fields[15-3], 10, 64)
	const ticksPerSecond = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// statusBytes reads a "<field>: <n> kB" line of /proc/<pid>/status.
func statusBytes(pid int, field string) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
