package e2e

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
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpumem/gpumem_exporter/internal/doccheck"
	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// The exporter's end-to-end tests without Prometheus: they run the
// exporter's binary (built once, cached, as the stack's) in simulated mode
// and check what a user sees: /metrics against docs/metrics.md, readiness,
// TLS and basic auth, the protocol from a client's side, flags, file
// descriptors. The attacks of docs/security.md run against the same binary
// in attack/.

// The roles of a re-executed test binary (exportertest.RoleEnv), each an
// instrumented process: client (kubernetes_test.go) and pusher
// (warning_test.go).
var roles = map[string]func(stdin io.Reader, stdout io.Writer) error{
	"client":   attrRunClient,
	pusherRole: pushClient,
}

// A role runs before TestMain: a re-executed test binary is that client
// and nothing else.
func init() {
	run, ok := roles[os.Getenv(exportertest.RoleEnv)]
	if !ok {
		return
	}
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// exporterCommand gives the exporter run with args: GPUMEM_E2E_EXPORTER,
// or the module's main package built (once, cached) with -race when this
// test binary has it.
func exporterCommand(t testing.TB) exportertest.Command {
	t.Helper()
	bin, err := exportertest.ExporterBinary("GPUMEM_E2E_EXPORTER", repoRoot, exportertest.RaceEnabled)
	if err != nil {
		t.Fatalf("building the exporter: %v", err)
	}
	return exportertest.BinaryCommand(bin)
}

// startExporter runs the exporter (exportertest.Start) until the test ends.
func startExporter(t *testing.T, args ...string) *exportertest.Exporter {
	t.Helper()
	return exportertest.Start(t, exporterCommand(t), args...)
}

// scrape parses one /metrics scrape, failing the test if it cannot.
func scrape(t *testing.T, e *exportertest.Exporter) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	body := e.Scrape(t)
	fams, err := exportertest.Families(body)
	if err != nil {
		t.Fatal(err)
	}
	return body, fams
}

// TestSimulatedExporterServesEveryMetric: every metric of docs/metrics.md
// (but the Kubernetes ones) is served while the simulated node runs its
// script, OOMs included, and a scrape with an OOM passes promtool.
func TestSimulatedExporterServesEveryMetric(t *testing.T) {
	t.Parallel()
	// At 300x the mix's first OOM comes after about 2 s.
	e := startExporter(t, "--nvml.simulated.speed=300")
	e.WaitReady(t)
	var want []string
	for _, name := range documentedMetrics(t) {
		if !strings.HasPrefix(name, "gpumem_kubernetes_") { // only with Kubernetes attribution on
			want = append(want, name)
		}
	}
	// Processes come, go and OOM: a family counts once any scrape had it.
	seen := map[string]bool{}
	var withOOM string
	missing := func() []string {
		var out []string
		for _, name := range want {
			if !seen[name] {
				out = append(out, name)
			}
		}
		return out
	}
	if !exportertest.Within(30*time.Second, func() bool {
		body, fams := scrape(t, e)
		for name := range fams {
			seen[name] = true
		}
		if strings.Contains(body, "gpumem_allocator_last_oom_request_bytes{") {
			withOOM = body
		}
		return withOOM != "" && len(missing()) == 0
	}) {
		t.Fatalf("documented metrics missing from every simulated scrape in 30 s (an OOM seen: %v): %v", withOOM != "", missing())
	}
	_, fams := scrape(t, e)
	if f := fams["gpumem_gpu_memory_total_bytes"]; len(f.GetMetric()) != 8 {
		t.Errorf("gpumem_gpu_memory_total_bytes has %d series, want 8", len(f.GetMetric()))
	}
	if !regexp.MustCompile(`gpumem_nvml_up 1\b`).MatchString(withOOM) {
		t.Error("gpumem_nvml_up is not 1 in simulated mode")
	}
	if !regexp.MustCompile(`gpumem_gpu_memory_unattributed_bytes\{gpu="7",uuid="[^"]+"\} [1-9]`).MatchString(withOOM) {
		t.Error("simulated GPU 7 (the mix puts 3 GiB of unlisted memory there) has no unattributed memory")
	}
	promtoolCheck(t, withOOM)
}

func TestMetricsDocMatchesExporter(t *testing.T) {
	t.Parallel()
	e := startExporter(t)
	e.WaitReady(t)
	var body string
	exportertest.Eventually(t, 10*time.Second, "a scrape with allocator series", func() bool {
		body = e.Scrape(t)
		return strings.Contains(body, "gpumem_allocator_reserved_bytes{")
	})
	documented := map[string]bool{}
	for _, n := range documentedMetrics(t) {
		documented[n] = true
	}
	fams, err := exportertest.Families(body)
	if err != nil {
		t.Fatal(err)
	}
	for name := range fams {
		if strings.HasPrefix(name, "gpumem_") && !documented[name] {
			t.Errorf("metric %s is served but not in docs/metrics.md", name)
		}
	}
	served := servedLabels(fams)
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
func servedLabels(fams map[string]*dto.MetricFamily) map[string]string {
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
	return doccheck.DocumentedLabels(t, "../docs/metrics.md")
}

func documentedMetrics(t *testing.T) []string {
	t.Helper()
	var names []string
	for name := range doccheck.DocumentedMetrics(t, "../docs/metrics.md") {
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
	t.Parallel()
	e := startExporter(t)
	e.WaitReady(t)
	if code, body := e.Get(t, "/-/healthy"); code != 200 || !strings.Contains(body, "Healthy") {
		t.Errorf("/-/healthy = %d %q", code, body)
	}
	code, body := e.Get(t, "/")
	if code != 200 {
		t.Fatalf("/ = %d", code)
	}
	for _, want := range []string{"gpumem_exporter", `href="/metrics"`, "context", "active", "inactive", "unattributed", "free", "GPU 7", "Out-of-memory reports"} {
		if !strings.Contains(body, want) {
			t.Errorf("landing page lacks %q", want)
		}
	}
	if code, _ := e.Get(t, "/nope"); code != 404 {
		t.Errorf("/nope = %d, want 404", code)
	}
	code, body = e.Get(t, "/api/v1/oom-reports")
	var reports struct {
		Reports []json.RawMessage `json:"reports"`
	}
	if code != 200 || json.Unmarshal([]byte(body), &reports) != nil {
		t.Errorf("/api/v1/oom-reports = %d %q", code, body)
	}
}

func TestNotReadyBeforeTheFirstPoll(t *testing.T) {
	t.Parallel()
	// The real backend on a machine without a driver: NVML never comes up,
	// the exporter serves gpumem_nvml_up 0 and says it is not ready.
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	e := startExporter(t, "--nvml.backend=nvml")
	exportertest.Eventually(t, 10*time.Second, "gpumem_nvml_up 0", func() bool {
		code, body := e.Get(t, "/metrics")
		return code == 200 && strings.Contains(body, "gpumem_nvml_up 0")
	})
	if code, _ := e.Get(t, "/-/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/-/ready without NVML = %d, want 503", code)
	}
	if n := strings.Count(e.Log.String(), "NVML unavailable"); n != 1 {
		t.Errorf("logged the missing driver %d times, want once", n)
	}
}

func TestScrapesLeakNoFileDescriptors(t *testing.T) {
	t.Parallel()
	e := startExporter(t)
	e.WaitReady(t)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	e.Client = client
	for i := 0; i < 10; i++ {
		e.Get(t, "/metrics")
	}
	before := e.FDs(t)
	// A descriptor leaked per request (or per 50) shows in 200 requests.
	for i := 0; i < 100; i++ {
		e.Get(t, "/metrics")
		e.Get(t, "/")
	}
	var after int
	if !exportertest.Within(5*time.Second, func() bool { after = e.FDs(t); return after <= before+2 }) {
		t.Errorf("open fds grew from %d to %d over 200 requests", before, after)
	}
}

func TestTLSAndBasicAuth(t *testing.T) {
	t.Parallel()
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
	e.Scheme = "https"
	e.Client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	e.User, e.Pass = "alice", "s3cret"
	e.WaitReady(t)
	if code, body := e.Get(t, "/metrics"); code != 200 || !strings.Contains(body, "gpumem_gpu_info") {
		t.Errorf("authorised TLS scrape = %d", code)
	}
	e.Pass = "wrong"
	if code, _ := e.Get(t, "/metrics"); code != http.StatusUnauthorized {
		t.Errorf("wrong password = %d, want 401", code)
	}
	e.Scheme, e.User = "http", ""
	e.Client = http.DefaultClient
	if code, _ := e.Get(t, "/metrics"); code == 200 {
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
	t.Parallel()
	e := startExporter(t)
	e.WaitReady(t)
	conn := e.Dial(t)
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
	// Neither a pod nor a Slurm job: the workload is the process on this
	// node (the exporter's --kubernetes.node-name, else the host name).
	workload := `",workload="` + localWorkload(t, os.Getpid()) + `"}`
	want := []string{
		`gpumem_allocator_reserved_bytes{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006` + workload + ` 3e+09`,
		`gpumem_allocator_inactive_bytes{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006` + workload + ` 2e+09`,
		`gpumem_allocator_last_oom_request_bytes{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006` + workload + ` 9.60495616e+08`,
		`gpumem_allocator_ooms_total{comm="%s",container="",gpu="6",namespace="",pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000006` + workload + ` 1`,
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", os.Getpid()))
	for i := range want {
		want[i] = fmt.Sprintf(want[i], strings.TrimSpace(string(comm)))
	}
	var body string
	if !exportertest.Within(5*time.Second, func() bool {
		body = e.Scrape(t)
		return len(missingLines(body, want)) == 0
	}) {
		t.Fatalf("missing from /metrics after 5 s:\n%s", strings.Join(missingLines(body, want), "\n"))
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
	code, reports := e.Get(t, "/api/v1/oom-reports")
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
	t.Parallel()
	e := startExporter(t, "--allocstats.max-message-bytes=1024")
	e.WaitReady(t)
	good, bad := e.Dial(t), e.Dial(t)
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
	want := []string{
		`gpumem_allocstats_messages_total{result="rejected",type="unknown"} 1`,
		`gpumem_allocstats_messages_total{result="oversize",type="unknown"} 1`,
		`gpumem_allocstats_messages_total{result="ok",type="stats"} 1`,
		`pid="` + pid + `",pod="",uuid="GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000001",workload="` + localWorkload(t, os.Getpid()) + `"} 7.340032e+06`,
	}
	var body string
	if !exportertest.Within(5*time.Second, func() bool {
		body = e.Scrape(t)
		return len(missingLines(body, want)) == 0
	}) {
		t.Fatalf("missing %v in\n%s", missingLines(body, want), exportertest.GrepLines(body, "allocstats_messages_total", "allocator_reserved"))
	}
	// The wrong version was rejected: counted under its type.
	body = e.Scrape(t)
	if !strings.Contains(body, `gpumem_allocstats_messages_total{result="rejected",type="stats"} 1`) {
		t.Errorf("a v:2 line was not counted as rejected:\n%s", exportertest.GrepLines(body, "allocstats_messages_total"))
	}
}

// missingLines returns the strings of want that body lacks.
func missingLines(body string, want []string) []string {
	var out []string
	for _, w := range want {
		if !strings.Contains(body, w) {
			out = append(out, w)
		}
	}
	return out
}

// TestReleasesStartupPagesOnceAfterTheFirstPoll: by default the exporter
// gives back what start-up alone used once its first poll is done, and
// goes on serving; --no-runtime.release-startup-pages keeps it all.
func TestReleasesStartupPagesOnceAfterTheFirstPoll(t *testing.T) {
	t.Parallel()
	const gaveBack = "gave back the memory start-up used"
	e := startExporter(t)
	exportertest.Eventually(t, 10*time.Second, "log line "+gaveBack, func() bool {
		return strings.Contains(e.Log.String(), gaveBack)
	})
	e.WaitReady(t)
	for i := 0; i < 3; i++ {
		if _, fams := scrape(t, e); fams["gpumem_gpu_memory_total_bytes"] == nil {
			t.Fatal("no gpumem_gpu_memory_total_bytes after the release")
		}
	}
	polls := e.Metric(t, `gpumem_nvml_poll_duration_seconds_count`)
	exportertest.Eventually(t, 10*time.Second, "two more polls", func() bool {
		return e.Metric(t, `gpumem_nvml_poll_duration_seconds_count`) >= polls+2
	})
	if n := strings.Count(e.Log.String(), gaveBack); n != 1 {
		t.Errorf("released %d times, want once", n)
	}

	kept := startExporter(t, "--no-runtime.release-startup-pages")
	kept.WaitReady(t)
	polls = kept.Metric(t, `gpumem_nvml_poll_duration_seconds_count`)
	exportertest.Eventually(t, 10*time.Second, "two more polls", func() bool {
		return kept.Metric(t, `gpumem_nvml_poll_duration_seconds_count`) >= polls+2
	})
	if strings.Contains(kept.Log.String(), gaveBack) {
		t.Error("released with --no-runtime.release-startup-pages")
	}
}

// localWorkload is the workload label the exporter gives a process of this
// host outside any pod or Slurm job.
func localWorkload(t *testing.T, pid int) string {
	t.Helper()
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Fatalf("host name: %q, %v", host, err)
	}
	return fmt.Sprintf("%s pid %d", host, pid)
}
