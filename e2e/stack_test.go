package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// Speed of the simulated node: 300 simulated seconds per real second, so
// that the mix's leaks, retries and out-of-memory errors (minutes apart in
// simulated time) happen within seconds of the test.
const simSpeed = "300"

// The Prometheus under test scrapes and evaluates every second.
const (
	scrapeInterval = time.Second
	// startTimeout bounds the start of each process; dataTimeout how long
	// the tests wait, from Prometheus's start, for every query to return
	// data.
	startTimeout = 30 * time.Second
	dataTimeout  = 45 * time.Second
)

var repoRoot = func() string {
	dir, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	return dir
}()

// stack is the exporter and the Prometheus scraping it.
type stack struct {
	dir          string
	exporterAddr string // host:port, also the target's instance label
	promURL      string
	promStart    time.Time // when Prometheus became ready: no sample is older
	procs        []*proc
}

// proc is a started process, its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // set when done is closed
}

var (
	stackOnce sync.Once
	theStack  *stack
	stackErr  error
	tmpDir    string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if theStack != nil {
		theStack.stop()
	}
	if tmpDir != "" {
		os.RemoveAll(tmpDir)
	}
	os.Exit(code)
}

// requireStack returns the running stack, starting it on first use (once
// for the whole package). Without prometheus on PATH the test is skipped,
// unless CI is set.
func requireStack(t *testing.T) *stack {
	t.Helper()
	if _, err := exec.LookPath("prometheus"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("prometheus is not on PATH, and CI is set: install it (Debian: apt-get install prometheus): %v", err)
		}
		t.Skip("prometheus is not on PATH (Debian: apt-get install prometheus): the end-to-end tests need a real Prometheus")
	}
	stackOnce.Do(func() { theStack, stackErr = startStack() })
	if stackErr != nil {
		t.Fatal(stackErr)
	}
	return theStack
}

func startStack() (*stack, error) {
	dir, err := os.MkdirTemp("", "gpumem-e2e-")
	if err != nil {
		return nil, err
	}
	tmpDir = dir
	// -race, as `make test` runs `go test -race ./...`: the packages are
	// already compiled for the race detector, so only the link is new, and
	// the binary is kept (as the attack tests' is) until the sources
	// change.
	bin, err := exportertest.ExporterBinary("GPUMEM_E2E_EXPORTER", repoRoot, true)
	if err != nil {
		return nil, fmt.Errorf("building the exporter: %w", err)
	}
	s := &stack{dir: dir}
	started := false
	defer func() {
		if !started {
			s.stop()
		}
	}()
	if s.exporterAddr, err = exportertest.FreeAddr(); err != nil {
		return nil, err
	}
	exp, err := s.start("exporter", bin,
		"--nvml.backend=simulated",
		"--nvml.simulated.speed="+simSpeed,
		"--nvml.poll-interval=200ms",
		"--web.listen-address="+s.exporterAddr,
		"--allocstats.socket="+filepath.Join(dir, "a.sock"),
	)
	if err != nil {
		return nil, err
	}
	if err := waitReady(exp, "http://"+s.exporterAddr+"/-/ready"); err != nil {
		return nil, err
	}

	rules, err := rulesEvery(dir, "rules.yml", scrapeInterval)
	if err != nil {
		return nil, err
	}
	fleetRules, err := rulesEvery(dir, "fleet-rules.yml", scrapeInterval)
	if err != nil {
		return nil, err
	}
	config := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files:
  - %[2]s
  - %[4]s
scrape_configs:
  - job_name: gpumem
    honor_labels: true
    static_configs:
      - targets: ['%[3]s']
`, scrapeInterval, rules, s.exporterAddr, fleetRules)
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		return nil, err
	}
	promAddr, err := exportertest.FreeAddr()
	if err != nil {
		return nil, err
	}
	s.promURL = "http://" + promAddr
	prom, err := s.start("prometheus", "prometheus",
		"--config.file="+configFile,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr,
	)
	if err != nil {
		return nil, err
	}
	if err := waitReady(prom, s.promURL+"/-/ready"); err != nil {
		return nil, err
	}
	s.promStart = time.Now()
	started = true
	return s, nil
}

// groupInterval matches a rule group's own interval.
var groupInterval = regexp.MustCompile(`(?m)^(\s+interval:) \S+$`)

// rulesEvery writes the rule file deploy/prometheus/<name> into dir with
// every group's interval set to every, and returns the copy's path: in
// production the groups run every 30 s or every minute, here as often as
// the scrapes, so that a test sees the rules' output within seconds.
func rulesEvery(dir, name string, every time.Duration) (string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", name))
	if err != nil {
		return "", err
	}
	if !groupInterval.Match(b) {
		return "", fmt.Errorf("%s: no group with an interval of its own to replace", name)
	}
	text := groupInterval.ReplaceAll(b, []byte("${1} "+every.String()))
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, text, 0o644)
}

func (s *stack) start(name, bin string, args ...string) (*proc, error) {
	logFile := filepath.Join(s.dir, name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = f, f
	// Killed with the test binary, also where it dies of its -timeout
	// without stopping the stack.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	s.procs = append(s.procs, p)
	return p, nil
}

// waitReady polls url until it answers 200, the process exits or
// startTimeout passes.
func waitReady(p *proc, url string) error {
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before %s answered: %v\n%s", p.name, url, p.err, p.tail())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s did not answer 200 within %s (last error: %v)\n%s", p.name, url, startTimeout, err, p.tail())
		}
	}
}

// tail returns the end of the process's log.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Sprintf("--- %s log (%s), last lines:\n%s", p.name, p.log, b)
}

// stop ends the processes, newest first: SIGTERM, then SIGKILL after 10 s.
func (s *stack) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// logs returns every process's log tail, for a failure message.
func (s *stack) logs() string {
	var b strings.Builder
	for _, p := range s.procs {
		b.WriteString(p.tail())
		b.WriteString("\n")
	}
	return b.String()
}

// sample is one value of a series.
type sample struct {
	t float64 // Unix seconds
	v float64
}

// series is one series of a query result: its labels and its samples
// (one for an instant vector).
type series struct {
	labels  map[string]string
	samples []sample
}

// apiResponse is Prometheus's HTTP API envelope.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

// api calls the HTTP API: POST for queries (no limit on their length), GET
// where the API takes nothing else (label values).
func (s *stack) api(ctx context.Context, method, path string, params url.Values) (json.RawMessage, error) {
	var req *http.Request
	var err error
	if method == http.MethodPost {
		req, err = http.NewRequestWithContext(ctx, method, s.promURL+path, strings.NewReader(params.Encode()))
		if req != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	} else {
		req, err = http.NewRequestWithContext(ctx, method, s.promURL+path+"?"+params.Encode(), nil)
	}
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: HTTP %d, not the API's JSON: %s", path, resp.StatusCode, bytes.TrimSpace(body))
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// query evaluates expr at t (/api/v1/query): a vector, or a range
// vector's raw samples.
func (s *stack) query(ctx context.Context, expr string, t time.Time) ([]series, error) {
	data, err := s.api(ctx, http.MethodPost, "/api/v1/query", url.Values{"query": {expr}, "time": {unix(t)}})
	if err != nil {
		return nil, err
	}
	return decodeResult(data)
}

// queryRange evaluates expr from start to end every step
// (/api/v1/query_range), as Grafana does for a graph.
func (s *stack) queryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]series, error) {
	data, err := s.api(ctx, http.MethodPost, "/api/v1/query_range", url.Values{
		"query": {expr}, "start": {unix(start)}, "end": {unix(end)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	})
	if err != nil {
		return nil, err
	}
	return decodeResult(data)
}

// labelValues returns the values of label on the series matching selector
// from start to end, as Grafana's label_values(selector, label).
func (s *stack) labelValues(ctx context.Context, label, selector string, start, end time.Time) ([]string, error) {
	data, err := s.api(ctx, http.MethodGet, "/api/v1/label/"+url.PathEscape(label)+"/values", url.Values{
		"match[]": {selector}, "start": {unix(start)}, "end": {unix(end)},
	})
	if err != nil {
		return nil, err
	}
	var values []string
	if err := json.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("label values: %w", err)
	}
	return values, nil
}

func unix(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

func decodeResult(data json.RawMessage) ([]series, error) {
	var r struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("query result: %w", err)
	}
	switch r.ResultType {
	case "vector", "matrix":
	case "scalar":
		// A scalar is one value, never "no data".
		var pt []any
		if err := json.Unmarshal(r.Result, &pt); err != nil {
			return nil, fmt.Errorf("scalar result: %w", err)
		}
		smp, err := decodeSample(pt)
		if err != nil {
			return nil, err
		}
		return []series{{labels: map[string]string{}, samples: []sample{smp}}}, nil
	default:
		return nil, fmt.Errorf("unexpected result type %q", r.ResultType)
	}
	var result []struct {
		Metric map[string]string `json:"metric"`
		Value  []any             `json:"value"`  // vector
		Values [][]any           `json:"values"` // matrix
	}
	if err := json.Unmarshal(r.Result, &result); err != nil {
		return nil, fmt.Errorf("%s result: %w", r.ResultType, err)
	}
	var out []series
	for _, res := range result {
		ser := series{labels: res.Metric}
		points := res.Values
		if res.Value != nil {
			points = [][]any{res.Value}
		}
		for _, pt := range points {
			smp, err := decodeSample(pt)
			if err != nil {
				return nil, err
			}
			ser.samples = append(ser.samples, smp)
		}
		out = append(out, ser)
	}
	return out, nil
}

func decodeSample(pt []any) (sample, error) {
	if len(pt) != 2 {
		return sample{}, errors.New("a sample is not [time, value]")
	}
	t, ok := pt[0].(float64)
	vs, ok2 := pt[1].(string)
	if !ok || !ok2 {
		return sample{}, fmt.Errorf("a sample is not [time, \"value\"]: %v", pt)
	}
	v, err := strconv.ParseFloat(vs, 64)
	if err != nil {
		return sample{}, fmt.Errorf("sample value %q: %w", vs, err)
	}
	return sample{t, v}, nil
}
