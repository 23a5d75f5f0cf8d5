package exportertest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// raceExitCode is the exit status of a program in which the race detector
// reported a race (GORACE exitcode, 66 by default).
const raceExitCode = 66

// ChildEnv is this process's environment plus extra, for a child process:
// GORACE gains atexit_sleep_ms=0, since a race-enabled program otherwise
// sleeps a second when it exits.
func ChildEnv(extra ...string) []string {
	env := make([]string, 0, len(os.Environ())+len(extra)+1)
	gorace := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		if v, ok := strings.CutPrefix(kv, "GORACE="); ok {
			gorace = strings.TrimSpace(v + " " + gorace)
			continue
		}
		env = append(env, kv)
	}
	return append(append(env, "GORACE="+gorace), extra...)
}

// RaceReported says whether err, from waiting for a child, is the exit
// status the race detector gives a program in which it found a race.
func RaceReported(err error) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.ExitCode() == raceExitCode
}

// Command makes the exporter's command line from its arguments: the built
// binary, or a test binary re-executed in the exporter's role. A command
// with a nil Env runs with ChildEnv(); one that sets Env should build it
// with ChildEnv too.
type Command func(args ...string) *exec.Cmd

// BinaryCommand is the Command of the exporter binary at path, run with
// ChildEnv().
func BinaryCommand(path string) Command {
	return func(args ...string) *exec.Cmd {
		cmd := exec.Command(path, args...)
		cmd.Env = ChildEnv()
		return cmd
	}
}

// Exporter is a running exporter, stopped (SIGINT) when the test ends.
type Exporter struct {
	Cmd    *exec.Cmd
	Addr   string // host:port of --web.listen-address
	Socket string // --allocstats.socket
	Log    *SyncBuffer
	Scheme string // http, or https with a --web.config.file
	Client *http.Client
	User   string // basic auth, when set
	Pass   string

	exited  chan struct{}
	waitErr error
}

// listeningOn is the exporter-toolkit's log line for each listener.
var listeningOn = regexp.MustCompile(`msg="Listening on" address=(\S+)`)

// Start runs the exporter with args after defaults: a web address the
// kernel picks (read back from the log), a 100 ms poll, a socket in a
// fresh directory, and unless args choose a backend the simulated node,
// at 60x unless they choose a speed (an hour of the mix's leaks, OOMs and
// exits a minute). It waits until
// the exporter listens. When the test ends the exporter gets SIGINT and
// must exit with status 0 within 5 s: an exporter that died during the
// test, or one in which the race detector found a race, fails it.
func Start(t testing.TB, command Command, args ...string) *Exporter {
	t.Helper()
	e := &Exporter{Socket: filepath.Join(ShortTempDir(t), "a.sock"), Log: &SyncBuffer{}, Scheme: "http", Client: http.DefaultClient, exited: make(chan struct{})}
	base := []string{"--nvml.poll-interval=100ms", "--allocstats.socket=" + e.Socket}
	given := strings.Join(args, " ")
	if !strings.Contains(given, "--web.listen-address=") {
		base = append(base, "--web.listen-address=127.0.0.1:0")
	}
	if !strings.Contains(given, "--nvml.backend=") {
		base = append(base, "--nvml.backend=simulated")
		if !strings.Contains(given, "--nvml.simulated.speed=") {
			base = append(base, "--nvml.simulated.speed=60")
		}
	}
	e.Cmd = command(append(base, args...)...)
	if e.Cmd.Env == nil {
		e.Cmd.Env = ChildEnv()
	}
	e.Cmd.Stdout, e.Cmd.Stderr = e.Log, e.Log
	if e.Cmd.SysProcAttr == nil {
		// Killed with the test binary, also where it dies of its -timeout
		// without running the cleanups.
		e.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := e.Cmd.Start(); err != nil {
		t.Fatalf("starting the exporter: %v", err)
	}
	go func() { e.waitErr = e.Cmd.Wait(); close(e.exited) }()
	t.Cleanup(func() { e.stop(t) })
	var m []string
	if !Within(15*time.Second, func() bool {
		m = listeningOn.FindStringSubmatch(e.Log.String())
		return m != nil || e.Exited()
	}) || m == nil {
		t.Fatalf("the exporter did not listen within 15 s; log:\n%s", e.Log.String())
	}
	e.Addr = m[1]
	return e
}

// Exited says whether the exporter process has ended.
func (e *Exporter) Exited() bool {
	select {
	case <-e.exited:
		return true
	default:
		return false
	}
}

func (e *Exporter) stop(t testing.TB) {
	t.Helper()
	if e.Exited() {
		t.Errorf("the exporter exited during the test: %v", e.waitErr)
	} else {
		e.Cmd.Process.Signal(os.Interrupt)
		select {
		case <-e.exited:
			switch {
			case RaceReported(e.waitErr):
				t.Errorf("the race detector found a race in the exporter (exit status %d)", raceExitCode)
			case e.waitErr != nil:
				t.Errorf("the exporter exited with %v after SIGINT, want status 0", e.waitErr)
			}
		case <-time.After(5 * time.Second):
			e.Cmd.Process.Kill()
			<-e.exited
			t.Errorf("the exporter did not stop within 5 s of SIGINT")
		}
	}
	if t.Failed() {
		t.Logf("exporter log:\n%s", e.Log.String())
	}
}

// Get requests path and returns the status and body; on a transport error,
// status 0 and the error's text.
func (e *Exporter) Get(t testing.TB, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", e.Scheme+"://"+e.Addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.User != "" {
		req.SetBasicAuth(e.User, e.Pass)
	}
	resp, err := e.Client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Scrape returns the body of /metrics, failing the test on another status.
func (e *Exporter) Scrape(t testing.TB) string {
	t.Helper()
	code, body := e.Get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d %s", code, body)
	}
	return body
}

// Metric returns the value of the first series of a scrape matching re
// (see MetricIn), or -1.
func (e *Exporter) Metric(t testing.TB, re string) float64 {
	t.Helper()
	_, body := e.Get(t, "/metrics")
	return MetricIn(body, re)
}

// WaitReady waits until /-/ready answers 200.
func (e *Exporter) WaitReady(t testing.TB) {
	t.Helper()
	if !Within(15*time.Second, func() bool { code, _ := e.Get(t, "/-/ready"); return code == http.StatusOK || e.Exited() }) || e.Exited() {
		t.Fatalf("exporter not ready within 15 s (exited: %v)", e.Exited())
	}
}

// Dial connects to the exporter's allocator-statistics socket as a client
// would, failing the test if it cannot; the connection is closed when the
// test ends.
func (e *Exporter) Dial(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", e.Socket)
	if err != nil {
		t.Fatalf("dialling the exporter's socket %s: %v", e.Socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Pid is the exporter's process id.
func (e *Exporter) Pid() int { return e.Cmd.Process.Pid }

// FDs counts the exporter's open file descriptors.
func (e *Exporter) FDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// SyncBuffer collects a child's output while tests read it.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreeAddr is a loopback address, host:port, on which no one listens: the
// kernel's pick, given back at once.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// ShortTempDir is a fresh directory under the system's temporary directory,
// removed when the test ends: t.TempDir's paths can exceed the 108 bytes a
// Unix socket's path may have.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ge")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
