package allocstats

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpumem/gpumem_exporter/internal/procfixture"
)

// testTotalBytes is the memory of the test devices (an H200's).
const testTotalBytes = 150754820096

type testServer struct {
	srv   *Server
	store *Store
	path  string
	done  chan error
}

// shortTempDir returns a directory whose paths fit in a socket address.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startServer runs a server on a fresh socket until the test ends. The
// known devices are testUUID and testUUID2.
func startServer(t *testing.T, configure func(*Config), hooks ...func(*Server)) *testServer {
	t.Helper()
	cfg := Config{
		SocketPath:    filepath.Join(shortTempDir(t), "s.sock"),
		Interval:      1500 * time.Millisecond,
		ServerVersion: "test",
		KnownDevice: func(uuid string) (string, uint64, bool) {
			return uuid, testTotalBytes, uuid == testUUID || uuid == testUUID2
		},
	}
	if configure != nil {
		configure(&cfg)
	}
	store := NewStore(time.Minute)
	srv, err := NewServer(cfg, store, nil)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	for _, h := range hooks {
		h(srv)
	}
	if err := srv.Listen(); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, store: store, path: srv.SocketPath(), done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ts.done:
			if err != nil {
				t.Errorf("Serve returned %v after shutdown, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return within 10s of the shutdown")
		}
	})
	return ts
}

type client struct {
	t *testing.T
	c *net.UnixConn
	r *bufio.Reader
}

func dial(t *testing.T, path string) *client {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("dialing %s: %v", path, err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(lines ...string) {
	c.t.Helper()
	for _, l := range lines {
		if _, err := c.c.Write([]byte(l + "\n")); err != nil {
			c.t.Fatalf("writing %.80q: %v", l, err)
		}
	}
}

// readLine reads one line from the daemon, failing after 5s.
func (c *client) readLine() (string, error) {
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return c.r.ReadString('\n')
}

// hello sends a hello and waits for the welcome, which proves the server
// handled every line sent before it.
func (c *client) hello() {
	c.t.Helper()
	c.send(`{"v":1,"type":"hello","framework":"pytorch"}`)
	if line, err := c.readLine(); err != nil || !strings.Contains(line, `"welcome"`) {
		c.t.Fatalf("waiting for the welcome: got %q, %v", line, err)
	}
}

// expectClosed waits until the daemon closes the connection.
func (c *client) expectClosed(within time.Duration) {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(within))
	for {
		_, err := c.r.ReadByte()
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return
		}
		c.t.Fatalf("the daemon did not close the connection within %s: %v", within, err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func (ts *testServer) messages(t *testing.T, typ, result string) float64 {
	return counterValue(t, ts.srv.messages.WithLabelValues(typ, result))
}

func statsLine(uuid string, reserved uint64, extra string) string {
	return fmt.Sprintf(`{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%d%s}]}`, uuid, reserved, extra)
}

func TestServerAnswersHelloWithWelcome(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.path)
	c.send(`{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-python/0.1.0"}`)
	line, err := c.readLine()
	if err != nil {
		t.Fatalf("reading the welcome: %v", err)
	}
	if want := `{"v":1,"type":"welcome","interval_ms":1500,"server":"test"}` + "\n"; line != want {
		t.Errorf("welcome = %q, want %q", line, want)
	}
	// A later hello updates the framework and gets no second welcome.
	c.send(`{"v":1,"type":"hello","framework":"jax"}`, statsLine(testUUID, 1, ""))
	eventually(t, "the second hello and the stats are applied", func() bool {
		p, ok := ts.store.Process(uint32(os.Getpid()))
		return ok && p.Framework == "jax" && len(p.Devices) == 1
	})
	c.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if extra, err := c.r.ReadString('\n'); err == nil {
		t.Errorf("a second hello was answered with %q", extra)
	}
	if got := ts.messages(t, wire.TypeHello, wire.ResultOK); got != 2 {
		t.Errorf(`messages_total{type="hello",result="ok"} = %v, want 2`, got)
	}
}

// writeSelf writes a procfs under dir in which this process started at
// start (clock ticks since boot), under its own uid.
func writeSelf(t *testing.T, dir string, start uint64) {
	t.Helper()
	procfixture.Write(t, dir, uint32(os.Getpid()), procfixture.Process{Comm: "go-test", Start: start, UID: strconv.Itoa(os.Geteuid())})
}

func TestServerTakesIdentityFromTheKernelNotTheMessage(t *testing.T) {
	procPath := t.TempDir()
	writeSelf(t, procPath, 777)
	ts := startServer(t, func(c *Config) { c.ProcPath = procPath })
	c := dial(t, ts.path)
	c.send(`{"v":1,"type":"stats","pid":1,"uid":0,"devices":[{"uuid":"` + testUUIDHex + `","reserved_bytes":918,"pid":1}]}`)
	c.hello()
	if _, ok := ts.store.Process(1); ok {
		t.Error("the pid in the message was used")
	}
	p := mustProcess(t, ts.store, uint32(os.Getpid()))
	if p.UID != uint32(os.Getuid()) || p.StartTime != 777 || !p.Connected {
		t.Errorf("process = %+v, want uid %d, start time 777, connected", p, os.Getuid())
	}
	if d := mustDevice(t, p, testUUID); d.Reserved != 918 {
		t.Errorf("reserved = %d, want 918", d.Reserved)
	}
}

func TestServerReusedPIDDoesNotInheritSeries(t *testing.T) {
	procPath := t.TempDir()
	writeSelf(t, procPath, 1001)
	ts := startServer(t, func(c *Config) { c.ProcPath = procPath })
	pid := uint32(os.Getpid())
	old := dial(t, ts.path)
	old.send(statsLine(testUUID, 5, `,"ooms":5`))
	old.hello()

	writeSelf(t, procPath, 1002)
	renewed := dial(t, ts.path) // the same pid with a new start time
	renewed.send(statsLine(testUUID, 7, `,"ooms":1`))
	renewed.hello()
	p := mustProcess(t, ts.store, pid)
	if p.StartTime != 1002 {
		t.Errorf("start time = %d, want the new process's 1002", p.StartTime)
	}
	if d := mustDevice(t, p, testUUID); d.OOMs != Some(1) || d.Reserved != 7 {
		t.Errorf("the new process inherited state: %+v, want ooms 1 and reserved 7", d)
	}

	// The old process's connection no longer feeds the store: it is
	// closed, so that its client (were it alive) would reconnect.
	old.send(statsLine(testUUID, 99, ""))
	old.expectClosed(5 * time.Second)
	if got := ts.messages(t, wire.TypeStats, wire.ResultRejected); got != 1 {
		t.Errorf("stats rejected = %v, want the old connection's 1", got)
	}
	if d := mustDevice(t, mustProcess(t, ts.store, pid), testUUID); d.Reserved != 7 {
		t.Errorf("the old connection overwrote the new process: reserved %d", d.Reserved)
	}
}

func TestServerClosesTheConnectionOnAnOversizeLine(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxMessageBytes = 128 })
	c := dial(t, ts.path)
	// Exactly at the limit is fine.
	exact := `{"v":1,"type":"hello","pad":"` + strings.Repeat("x", 128-len(`{"v":1,"type":"hello","pad":""}`)) + `"}`
	if len(exact) != 128 {
		t.Fatalf("test line has %d bytes", len(exact))
	}
	c.send(exact)
	if _, err := c.readLine(); err != nil {
		t.Fatalf("a line of exactly the limit was not answered: %v", err)
	}
	c.send(`{"v":1,"type":"hello","pad":"` + strings.Repeat("x", 200) + `"}`)
	c.expectClosed(5 * time.Second)
	eventually(t, "the oversize line is counted", func() bool {
		return ts.messages(t, wire.TypeUnknown, wire.ResultOversize) == 1
	})
	if n := ts.messages(t, wire.TypeHello, wire.ResultOK); n != 1 {
		t.Errorf("hello ok = %v, want 1", n)
	}
}

func TestServerSkipsBadLinesAndKeepsTheConnection(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.path)
	c.send(
		`this is not json`,
		``,   // blank lines are ignored
		"\r", // so are CR-only lines
		`{"v":2,"type":"stats","devices":[]}`,
		`{"v":1,"type":"gossip"}`,
		statsLine(testUUID, 1, `,"active_bytes":-1`),
		statsLine(testUUID, 2, `,"active_bytes":1`)+"\r",
	)
	c.hello()
	d := mustDevice(t, mustProcess(t, ts.store, uint32(os.Getpid())), testUUID)
	if d.Reserved != 2 || d.Active != Some(1) {
		t.Errorf("device = %+v, want the valid line's reserved 2 active 1", d)
	}
	for _, m := range []struct {
		typ, result string
		want        float64
	}{
		{wire.TypeUnknown, wire.ResultMalformed, 1},
		{wire.TypeStats, wire.ResultRejected, 2},
		{wire.TypeUnknown, wire.ResultRejected, 1},
		{wire.TypeStats, wire.ResultOK, 1},
	} {
		if got := ts.messages(t, m.typ, m.result); got != m.want {
			t.Errorf("messages_total{type=%q,result=%q} = %v, want %v", m.typ, m.result, got, m.want)
		}
	}
}

func TestServerRejectsUnknownDevices(t *testing.T) {
	var oomCalls atomic.Int32
	ts := startServer(t, nil, func(s *Server) { s.store.OnOOM(observeOOM(func(OOMEvent) { oomCalls.Add(1) })) })
	c := dial(t, ts.path)
	c.send(
		`{"v":1,"type":"stats","devices":[{"uuid":"`+testUUID+`","reserved_bytes":1},{"uuid":"`+unknownUUID+`","reserved_bytes":1}]}`,
		`{"v":1,"type":"oom","uuid":"`+unknownUUID+`","requested_bytes":1}`,
	)
	c.hello()
	if p, ok := ts.store.Process(uint32(os.Getpid())); ok && len(p.Devices) > 0 {
		t.Errorf("a line naming an unknown device was partly applied: %+v", p.Devices)
	}
	if got := ts.messages(t, wire.TypeStats, wire.ResultRejected); got != 1 {
		t.Errorf("stats rejected = %v, want 1", got)
	}
	if got := ts.messages(t, wire.TypeOOM, wire.ResultRejected); got != 1 {
		t.Errorf("oom rejected = %v, want 1", got)
	}
	if oomCalls.Load() != 0 {
		t.Error("OnOOM was called for an unknown device")
	}
}

func TestServerCanonicalisesUUIDsThroughNVML(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.KnownDevice = func(uuid string) (string, uint64, bool) {
			return "GPU-NVML-SPELLING", 0, uuid == testUUID
		}
	})
	c := dial(t, ts.path)
	c.send(statsLine(testUUIDHex, 3, ""))
	c.hello()
	mustDevice(t, mustProcess(t, ts.store, uint32(os.Getpid())), "GPU-NVML-SPELLING")
}

func TestServerOOMReachesStoreAndCallback(t *testing.T) {
	events := make(chan OOMEvent, 1)
	ts := startServer(t, nil, func(s *Server) { s.store.OnOOM(observeOOM(func(ev OOMEvent) { events <- ev })) })
	c := dial(t, ts.path)
	c.send(`{"v":1,"type":"oom","uuid":"` + testUUIDBare + `","requested_bytes":960495616,"limit_bytes":4294967296,"pid":1}`)
	select {
	case ev := <-events:
		if ev.PID != uint32(os.Getpid()) || ev.UUID != testUUID || ev.Requested != 960495616 || ev.Limit != Some(4294967296) || ev.Free.OK {
			t.Errorf("OnOOM got %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnOOM was not called")
	}
	d := mustDevice(t, mustProcess(t, ts.store, uint32(os.Getpid())), testUUID)
	if d.LastOOMRequest != Some(960495616) || d.LastOOMTime.IsZero() {
		t.Errorf("device after oom: %+v", d)
	}
}

func TestServerOOMCarriesTheStatsAtTheFailureAndAnswersOnTheConnection(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.OOMVerdict = true }, func(s *Server) {
		s.store.OnOOM(observeOOM(func(ev OOMEvent) {
			if ev.Stats.Reserved != 4096 || ev.Stats.Active != Some(1024) {
				ev.ReplyTo.Reply([]byte(`{"v":1,"type":"verdict","cause":"wrong-stats"}` + "\n"))
				return
			}
			ev.ReplyTo.Reply([]byte("not a line")) // no newline: not sent
			ev.ReplyTo.Reply([]byte(`{"v":1,"type":"verdict","cause":"limit"}` + "\n"))
		}))
	})
	c := dial(t, ts.path)
	c.send(`{"v":1,"type":"hello"}`)
	welcome, err := c.readLine()
	if err != nil || !strings.Contains(welcome, `"oom_verdict":true`) {
		t.Fatalf("welcome %q (%v): want it to announce verdicts", welcome, err)
	}
	// As a client sends them at a failure: the stats, then the oom.
	c.send(statsLine(testUUID, 4096, `,"active_bytes":1024`), `{"v":1,"type":"oom","uuid":"`+testUUID+`","requested_bytes":8192}`)
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := c.readLine()
	if err != nil || line != `{"v":1,"type":"verdict","cause":"limit"}`+"\n" {
		t.Errorf("answer to the oom: %q (%v), want the verdict line alone", line, err)
	}
}

func TestServerDisconnectedProcessExpiresAfterTTL(t *testing.T) {
	ts := startServer(t, nil)
	pid := uint32(os.Getpid())
	c := dial(t, ts.path)
	c.send(statsLine(testUUID, 1, ""))
	c.hello()
	c.c.Close()
	eventually(t, "the process shows as disconnected", func() bool {
		p, ok := ts.store.Process(pid)
		return ok && !p.Connected
	})
	alive := func(uint32, uint64) bool { return true }
	ts.store.Prune(time.Now(), alive)
	if _, ok := ts.store.Process(pid); !ok {
		t.Fatal("the process was pruned right after it disconnected, before the TTL")
	}
	ts.store.Prune(time.Now().Add(time.Minute+time.Second), alive)
	if _, ok := ts.store.Process(pid); ok {
		t.Error("the process is still there a TTL after it disconnected")
	}
}

func TestServerCountersNeverGoBackwards(t *testing.T) {
	ts := startServer(t, nil)
	c := dial(t, ts.path)
	pid := uint32(os.Getpid())
	var last uint64
	for _, raw := range []int{1, 3, 0, 2, 0, 0, 5} {
		want := ts.messages(t, wire.TypeStats, wire.ResultOK) + 1
		c.send(statsLine(testUUID, 1, fmt.Sprintf(`,"alloc_retries":%d`, raw)))
		eventually(t, "the stats are applied", func() bool { return ts.messages(t, wire.TypeStats, wire.ResultOK) == want })
		got := mustDevice(t, mustProcess(t, ts.store, pid), testUUID).AllocRetries
		if !got.OK || got.V < last {
			t.Fatalf("client sent %d: exported alloc_retries %+v after %d", raw, got, last)
		}
		last = got.V
	}
	if last != 3+2+5 {
		t.Errorf("alloc_retries after 1,3,reset,2,reset,reset,5 = %d, want 10", last)
	}
}

func TestServerClosesIdleConnections(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.IdleTimeout = 100 * time.Millisecond })
	c := dial(t, ts.path)
	c.hello()
	start := time.Now()
	c.expectClosed(5 * time.Second)
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("closed after %s, before the idle timeout", d)
	}
	eventually(t, "the connection gauge falls to 0", func() bool { return gaugeValue(t, ts.srv.connections) == 0 })
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func TestServerEnforcesMaxConnections(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxConnections = 2 })
	a, b := dial(t, ts.path), dial(t, ts.path)
	a.hello()
	b.hello()
	extra := dial(t, ts.path)
	extra.expectClosed(5 * time.Second)
	if got := counterValue(t, ts.srv.connectionsRejected.WithLabelValues(rejectMaxConnections)); got != 1 {
		t.Errorf("connections rejected = %v, want 1", got)
	}
	a.c.Close()
	eventually(t, "a slot is free again", func() bool { return gaugeValue(t, ts.srv.connections) == 1 })
	dial(t, ts.path).hello()
}

func TestServerClosesConnectionsWithoutPeerCredentials(t *testing.T) {
	ts := startServer(t, nil, func(s *Server) {
		s.identify = func(kernelConn, time.Duration) (*peer, error) {
			return nil, fmt.Errorf("%w: %w", errPeerCredentials, errors.New("no credentials"))
		}
	})
	dial(t, ts.path).expectClosed(5 * time.Second)
	eventually(t, "the rejection is counted", func() bool {
		return counterValue(t, ts.srv.connectionsRejected.WithLabelValues(rejectPeerCred)) == 1
	})
}

func TestServerClientThatNeverReadsDoesNotBlockOthers(t *testing.T) {
	ts := startServer(t, nil)
	lazy := dial(t, ts.path)
	lazy.c.SetReadBuffer(1024)
	for i := 0; i < 50; i++ {
		lazy.send(`{"v":1,"type":"hello","framework":"x"}`)
	}
	lazy.send(statsLine(testUUID, 1, ""))
	for i := 0; i < 5; i++ {
		dial(t, ts.path).hello()
	}
}

func TestServerManyConcurrentClients(t *testing.T) {
	const n = 1000
	var nextPID atomic.Uint32
	ts := startServer(t, func(c *Config) { c.MaxConnections, c.MaxConnectionsPerUID = 2*n, 2*n }, func(s *Server) {
		s.store.SetProcessLimits(2*n, 2*n)
		s.identify = func(kernelConn, time.Duration) (*peer, error) {
			return &peer{id: Identity{PID: 10000 + nextPID.Add(1), UID: 1000, StartTime: 1}}, nil
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := net.Dial("unix", ts.path)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := fmt.Fprintf(c, "{\"v\":1,\"type\":\"hello\"}\n%s\n", statsLine(testUUID, uint64(i), "")); err != nil {
				errs <- err
				return
			}
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				errs <- fmt.Errorf("client %d waiting for the welcome: %w", i, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(t, "every client's stats are applied", func() bool { return ts.messages(t, wire.TypeStats, wire.ResultOK) == n })
	seen := make(map[uint64]bool)
	for _, p := range ts.store.Processes() {
		if len(p.Devices) == 1 {
			seen[p.Devices[0].Reserved] = true
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct clients recorded, want %d", len(seen), n)
	}
}

func TestServeShutdownClosesEverythingAndRemovesTheSocket(t *testing.T) {
	store := NewStore(time.Minute)
	path := filepath.Join(shortTempDir(t), "s.sock")
	srv, err := NewServer(Config{SocketPath: path, SocketMode: 0o660}, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("socket file mode = %v, want a socket with 0660", fi.Mode())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	c := dial(t, path)
	c.hello()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the context was cancelled")
	}
	c.expectClosed(5 * time.Second)
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file still there after shutdown: %v", err)
	}
}

func TestNewServerChecksConfig(t *testing.T) {
	for _, cfg := range []Config{
		{MaxMessageBytes: 10},
		{MaxConnections: -1},
		{MaxDevices: -1},
		{IdleTimeout: -time.Second},
		{SocketMode: os.ModeDir | 0o666},
	} {
		if _, err := NewServer(cfg, NewStore(0), nil); err == nil {
			t.Errorf("NewServer(%+v) accepted an invalid config", cfg)
		}
	}
	if _, err := NewServer(Config{}, nil, nil); err == nil {
		t.Error("NewServer accepted a nil store")
	}
}

func TestServerPreinitialisesMessageCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, err := NewServer(Config{}, NewStore(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(srv)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, mf := range mfs {
		counts[mf.GetName()] = len(mf.GetMetric())
	}
	if counts["gpumem_allocstats_messages_total"] != len(messageLabels) || counts["gpumem_allocstats_connections"] != 1 ||
		counts["gpumem_allocstats_connections_rejected_total"] != 4 || counts["gpumem_allocstats_connections_closed_total"] != 5 {
		t.Errorf("series per metric at start: %v", counts)
	}
}

// TestAtTheCapAUIDWithoutAConnectionGetsOne: root can spread connections
// over any number of uids, each under the per-uid cap, until the global
// cap is full. A uid that holds no connection then takes the place of the
// newest connection of the uid that holds the most.
func TestAtTheCapAUIDWithoutAConnectionGetsOne(t *testing.T) {
	var mu sync.Mutex
	var queue []uint32 // the uids of the next connections, in accept order
	uids := map[kernelConn]uint32{}
	var pid atomic.Uint32
	ts := startServer(t, func(c *Config) { c.MaxConnections, c.MaxConnectionsPerUID = 4, 4 }, func(s *Server) {
		s.connectingUID = func(c kernelConn) (uint32, bool) {
			mu.Lock()
			defer mu.Unlock()
			uid := queue[0]
			queue = queue[1:]
			uids[c] = uid
			return uid, true
		}
		s.identify = func(c kernelConn, _ time.Duration) (*peer, error) {
			mu.Lock()
			defer mu.Unlock()
			return &peer{id: Identity{PID: 7000 + pid.Add(1), UID: uids[c], StartTime: 1}}, nil
		}
	})
	connect := func(uid uint32) *client {
		mu.Lock()
		queue = append(queue, uid)
		mu.Unlock()
		return dial(t, ts.path)
	}
	first := []*client{connect(2000), connect(2000), connect(2001)}
	newest := connect(2000)
	for _, c := range append(first, newest) {
		c.hello()
	}
	newcomer := connect(1000)
	newcomer.hello()
	newest.expectClosed(5 * time.Second)
	for _, c := range first {
		c.expectOpen()
	}
	connect(1000).expectClosed(5 * time.Second) // it holds one now
	connect(2001).expectClosed(5 * time.Second) // so does every other uid here
	if got := counterValue(t, ts.srv.connectionsClosed.WithLabelValues(closeMaxConnections)); got != 1 {
		t.Errorf("connections closed to make room = %v, want 1", got)
	}
	if got := counterValue(t, ts.srv.connectionsRejected.WithLabelValues(rejectMaxConnections)); got != 2 {
		t.Errorf("connections refused at the cap = %v, want 2", got)
	}
}

// TestAtTheCapNoUIDLosesItsOnlyConnection: when every uid holds one
// connection, a new uid is refused like any other.
func TestAtTheCapNoUIDLosesItsOnlyConnection(t *testing.T) {
	var next atomic.Uint32
	ts := startServer(t, func(c *Config) { c.MaxConnections = 2 }, func(s *Server) {
		s.connectingUID = func(kernelConn) (uint32, bool) { return 3000 + next.Add(1), true }
	})
	a, b := dial(t, ts.path), dial(t, ts.path)
	a.hello()
	b.hello()
	dial(t, ts.path).expectClosed(5 * time.Second)
	a.expectOpen()
	b.expectOpen()
}

// expectOpen checks that the daemon has not closed the connection: a
// read waits, and nothing comes.
func (c *client) expectOpen() {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.r.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		c.t.Fatalf("the connection is not open and quiet: %v", err)
	}
}
