package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpumem/gpumem_exporter/internal/doccheck"
)

// End-to-end tests: they run the exporter as its own process, in
// simulated mode. The process is this test binary re-executed with
// roleEnv=exporter, which runs main() instead of the tests (no separate
// build: the binary is already compiled, with the same flags as the tests).

// roleEnv tells a re-executed test binary what to be: "exporter" (main)
// or "client" (an instrumented process, attribution_test.go).
const roleEnv = "GPUMEM_TEST_ROLE"

// extraRoles are further roles, registered by other test files' init
// (security_test.go); each returns the exit status.
var extraRoles = map[string]func() int{}

var binary string

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "exporter":
		os.Args = append([]string{exporterName}, os.Args[1:]...)
		main()
		os.Exit(0)
	case "client":
		if err := attrRunClient(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if run, ok := extraRoles[os.Getenv(roleEnv)]; ok {
		os.Exit(run())
	}
	binary = os.Args[0]
	os.Exit(m.Run())
}

// exporterCommand is the exporter run with args.
func exporterCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), roleEnv+"=exporter")
	return cmd
}

type exporter struct {
	cmd    *exec.Cmd
	addr   string
	socket string
	log    *syncBuffer
	scheme string
	client *http.Client
	user   string
	pass   string
}

// syncBuffer collects the exporter's output while tests read it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// shortTempDir keeps Unix socket paths under the 108-byte limit.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ge")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startExporter(t *testing.T, args ...string) *exporter {
	t.Helper()
	e := &exporter{addr: freePort(t), socket: filepath.Join(shortTempDir(t), "a.sock"), log: &syncBuffer{}, scheme: "http", client: http.DefaultClient}
	base := []string{
		"--web.listen-address=" + e.addr,
		"--nvml.poll-interval=100ms",
		"--allocstats.socket=" + e.socket,
	}
	if !strings.Contains(strings.Join(args, " "), "--nvml.backend=") {
		// The mix at 60x: an hour of workloads (leaks, OOMs, exits) a minute.
		base = append(base, "--nvml.backend=simulated", "--nvml.simulated.speed=60")
	}
	args = append(base, args...)
	e.cmd = exporterCommand(args...)
	e.cmd.Stdout = e.log
	e.cmd.Stderr = e.log
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- e.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			e.cmd.Process.Kill()
			t.Errorf("exporter did not stop within 5s of SIGINT")
		}
		if t.Failed() {
			t.Logf("exporter log:\n%s", e.log.String())
		}
	})
	return e
}

func (e *exporter) get(t *testing.T, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", e.scheme+"://"+e.addr+path, nil)
	if e.user != "" {
		req.SetBasicAuth(e.user, e.pass)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// within polls cond until it holds or timeout passes, and says which.
func within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// eventually fails the test when cond does not hold within timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !within(timeout, cond) {
		t.Fatalf("no %s within %s", what, timeout)
	}
}

func (e *exporter) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if code, _ := e.get(t, "/-/ready"); code == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("exporter not ready after 15s; log:\n%s", e.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func parseMetrics(t *testing.T, body string) map[string]*dto {
	t.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	out := map[string]*dto{}
	for name, f := range fams {
		out[name] = &dto{f.GetType().String(), len(f.GetMetric())}
	}
	return out
}

type dto struct {
	typ   string
	count int
}

func TestSimulatedExporterServesEveryMetric(t *testing.T) {
	e := startExporter(t)
	e.waitReady(t)
	// Let the script run long enough for processes to exit and OOM.
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, body = e.get(t, "/metrics")
		if strings.Contains(body, "gpumem_allocator_last_oom_request_bytes{") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	fams := parseMetrics(t, body)
	for _, name := range documentedMetrics(t) {
		if strings.HasPrefix(name, "gpumem_kubernetes_") {
			continue // only with Kubernetes attribution on
		}
		if _, ok := fams[name]; !ok {
			t.Errorf("documented metric %s missing from a simulated scrape", name)
		}
	}
	if f := fams["gpumem_gpu_memory_total_bytes"]; f == nil || f.count != 8 {
		t.Errorf("gpumem_gpu_memory_total_bytes series = %+v, want 8", f)
	}
	if !regexp.MustCompile(`gpumem_nvml_up 1\b`).MatchString(body) {
		t.Error("gpumem_nvml_up is not 1 in simulated mode")
	}
	if !regexp.MustCompile(`gpumem_gpu_memory_unattributed_bytes\{gpu="7",uuid="[^"]+"\} [1-9]`).MatchString(body) {
		t.Error("simulated GPU 7 (the mix puts 3 GiB of unlisted memory there) has no unattributed memory")
	}
	promtoolCheck(t, body)
}

func TestMetricsDocMatchesExporter(t *testing.T) {
	e := startExporter(t)
	e.waitReady(t)
	var body string
	eventually(t, 10*time.Second, "a scrape with allocator series", func() bool {
		_, body = e.get(t, "/metrics")
		return strings.Contains(body, "gpumem_allocator_reserved_bytes{")
	})
	documented := map[string]bool{}
	for _, n := range documentedMetrics(t) {
		documented[n] = true
	}
	served := servedLabels(t, body)
	for name := range parseMetrics(t, body) {
		if strings.HasPrefix(name, "gpumem_") && !documented[name] {
			t.Errorf("metric %s is served but not in docs/metrics.md", name)
		}
	}
	for name, want := range documentedLabels(t) {
		got, ok := served[name]
		if !ok {
			continue // not in this scrape; TestSimulatedExporterServesEveryMetric checks presence
		}
		if got != want {
			t.Errorf("%s: served labels {%s}, docs/metrics.md says {%s}", name, got, want)
		}
	}
}

// servedLabels maps each metric family to its sorted label names.
func servedLabels(t *testing.T, body string) map[string]string {
	t.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for name, f := range fams {
		set := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				set[l.GetName()] = true
			}
		}
		var names []string
		for n := range set {
			names = append(names, n)
		}
		sort.Strings(names)
		out[name] = strings.Join(names, ",")
	}
	return out
}

func documentedLabels(t *testing.T) map[string]string {
	return doccheck.DocumentedLabels(t, "docs/metrics.md")
}

func documentedMetrics(t *testing.T) []string {
	t.Helper()
	var names []string
	for name := range doccheck.DocumentedMetrics(t, "docs/metrics.md") {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func promtoolCheck(t *testing.T, body string) {
	t.Helper()
	cmd := exec.Command(doccheck.Promtool(t), "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

func TestReadinessLandingPageAndHealth(t *testing.T) {
	e := startExporter(t)
	e.waitReady(t)
	if code, body := e.get(t, "/-/healthy"); code != 200 || !strings.Contains(body, "Healthy") {
		t.Errorf("/-/healthy = %d %q", code, body)
	}
	code, body := e.get(t, "/")
	if code != 200 {
		t.Fatalf("/ = %d", code)
	}
	for _, want := range []string{"gpumem_exporter", `href="/metrics"`, "context", "active", "inactive", "unattributed", "free", "GPU 7", "Out-of-memory reports"} {
		if !strings.Contains(body, want) {
			t.Errorf("landing page lacks %q", want)
		}
	}
	if code, _ := e.get(t, "/nope"); code != 404 {
		t.Errorf("/nope = %d, want 404", code)
	}
	code, body = e.get(t, "/api/v1/oom-reports")
	var reports struct {
		Reports []json.RawMessage `json:"reports"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &reports) != nil {
		t.Errorf("/api/v1/oom-reports = %d %q", code, body)
	}
}

func TestNotReadyBeforeTheFirstPoll(t *testing.T) {
	// The real backend on a machine without a driver: NVML never comes up,
	// the exporter serves gpumem_nvml_up 0 and says it is not ready.
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	e := startExporter(t, "--nvml.backend=nvml")
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := e.get(t, "/metrics")
		if code == 200 && strings.Contains(body, "gpumem_nvml_up 0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gpumem_nvml_up 0 within 10s: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := e.get(t, "/-/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/-/ready without NVML = %d, want 503", code)
	}
	if n := strings.Count(e.log.String(), "NVML unavailable"); n != 1 {
		t.Errorf("logged the missing driver %d times, want once", n)
	}
}

func TestScrapesLeakNoFileDescriptors(t *testing.T) {
	e := startExporter(t)
	e.waitReady(t)
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	e.client = client
	for i := 0; i < 10; i++ {
		e.get(t, "/metrics")
	}
	before := fds()
	for i := 0; i < 200; i++ {
		e.get(t, "/metrics")
		e.get(t, "/")
	}
	var after int
	if !within(5*time.Second, func() bool { after = fds(); return after <= before+2 }) {
		t.Errorf("open fds grew from %d to %d over 400 requests", before, after)
	}
}

func TestTLSAndBasicAuth(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600)
	hash, _ := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	cfg := fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n  alice: %s\n",
		filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), hash)
	os.WriteFile(filepath.Join(dir, "web.yml"), []byte(cfg), 0o600)

	e := startExporter(t, "--web.config.file="+filepath.Join(dir, "web.yml"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	e.scheme = "https"
	e.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	e.user, e.pass = "alice", "s3cret"
	e.waitReady(t)
	if code, body := e.get(t, "/metrics"); code != 200 || !strings.Contains(body, "gpumem_gpu_info") {
		t.Errorf("authorised TLS scrape = %d", code)
	}
	e.pass = "wrong"
	if code, _ := e.get(t, "/metrics"); code != http.StatusUnauthorized {
		t.Errorf("wrong password = %d, want 401", code)
	}
	e.scheme, e.user = "http", ""
	e.client = http.DefaultClient
	if code, _ := e.get(t, "/metrics"); code == 200 {
		t.Error("plain HTTP scrape succeeded against a TLS listener")
	}
}

func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestProtocolBlackBox speaks wire protocol v1 (docs/protocol.md) to the
// simulated daemon as a client would, and reads the result in /metrics.
func TestProtocolBlackBox(t *testing.T) {
	e := startExporter(t)
	e.waitReady(t)
	conn, err := net.Dial("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	send := func(line string) {
		t.Helper()
		if _, err := io.WriteString(conn, line+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"e2e/1"}`)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	welcome, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("no welcome: %v", err)
	}
	var w map[string]any
	if json.Unmarshal([]byte(welcome), &w) != nil || w["type"] != "welcome" || w["v"] != float64(1) || w["interval_ms"] == nil {
		t.Fatalf("welcome = %q", welcome)
	}
	// A spoofed pid is ignored, the bare 32-hex UUID spelling is matched,
	// a malformed line and an unknown device are skipped without dropping
	// the connection.
	send(`{"v":1,"type":"stats","pid":1,"devices":[{"uuid":"5f0e3c1a7b2d4e89a1c3000000000006","reserved_bytes":3000000000,"active_bytes":1000000000,"alloc_retries":2,"ooms":1}]}`)
	send(`{"v":1,"type":"stats","devices":[`)
	send(`{"v":1,"type":"stats","devices":[{"uuid":"GPU-ffffffff-ffff-ffff-ffff-ffffffffffff","reserved_bytes":1}]}`)
	send(`{"v":1,"type":"oom","uuid":"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006","requested_bytes":960495616,"limit_bytes":4294967296,"free_bytes":1}`)
	pid := fmt.Sprint(os.Getpid())
	want := []string{
		`gpumem_allocator_reserved_bytes{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006"} 3e+09`,
		`gpumem_allocator_inactive_bytes{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006"} 2e+09`,
		`gpumem_allocator_last_oom_request_bytes{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006"} 9.60495616e+08`,
		`gpumem_allocator_ooms_total{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006"} 1`,
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", os.Getpid()))
	var body string
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, body = e.get(t, "/metrics")
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(body, fmt.Sprintf(w, strings.TrimSpace(string(comm))))
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			for _, w := range want {
				if !strings.Contains(body, fmt.Sprintf(w, strings.TrimSpace(string(comm)))) {
					t.Errorf("missing %s", fmt.Sprintf(w, strings.TrimSpace(string(comm))))
				}
			}
			t.FailNow()
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(body, `pid="1"`) {
		t.Error("a pid given in a message was used")
	}
	for _, w := range []string{
		`gpumem_allocstats_messages_total{result="malformed",type="unknown"} 1`,
		`gpumem_allocstats_messages_total{result="rejected",type="stats"} 1`,
		`gpumem_allocstats_messages_total{result="ok",type="stats"} 1`,
		`gpumem_allocstats_connections 1`,
	} {
		if !strings.Contains(body, w) {
			t.Errorf("ingest health lacks %s", w)
		}
	}
	code, reports := e.get(t, "/api/v1/oom-reports")
	if code != 200 || !strings.Contains(reports, `"requested_bytes":960495616`) {
		t.Errorf("oom report missing: %d %s", code, reports)
	}
	// The connection survived the bad lines.
	send(`{"v":1,"type":"stats","devices":[{"uuid":"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006","reserved_bytes":0}]}`)
	conn.Close()
}

// TestProtocolLimitsBlackBox: an unknown type and a wrong version are
// counted and skipped, the connection stays; a line over the limit closes
// the connection; other clients are not affected.
func TestProtocolLimitsBlackBox(t *testing.T) {
	e := startExporter(t, "--allocstats.max-message-bytes=1024")
	e.waitReady(t)
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("unix", e.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	good, bad := dial(), dial()
	io.WriteString(good, `{"v":1,"type":"shiny-new-type","x":1}`+"\n")
	io.WriteString(good, `{"v":2,"type":"stats","devices":[]}`+"\n")
	io.WriteString(good, `{"v":1,"type":"stats","devices":[{"uuid":"GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000001","reserved_bytes":7340032}]}`+"\n")

	io.WriteString(bad, `{"v":1,"type":"stats","devices":[{"uuid":"`+strings.Repeat("a", 2000)+`"}]}`+"\n")
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	// Closed with the rest of the line unread: EOF or a reset.
	if _, err := bad.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after an oversize line: read = %v, want the connection closed", err)
	}

	pid := fmt.Sprint(os.Getpid())
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, body := e.get(t, "/metrics")
		want := []string{
			`gpumem_allocstats_messages_total{result="rejected",type="unknown"} 1`,
			`gpumem_allocstats_messages_total{result="oversize",type="unknown"} 1`,
			`gpumem_allocstats_messages_total{result="ok",type="stats"} 1`,
			`pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000001"} 7.340032e+06`,
		}
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = w
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("missing %s in\n%s", missing, grepLines(body, "allocstats_messages_total", "allocator_reserved"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The wrong version was rejected: counted under its type.
	_, body := e.get(t, "/metrics")
	if !strings.Contains(body, `gpumem_allocstats_messages_total{result="rejected",type="stats"} 1`) {
		t.Errorf("a v:2 line was not counted as rejected:\n%s", grepLines(body, "allocstats_messages_total"))
	}
}

func grepLines(body string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
