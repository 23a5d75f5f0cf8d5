package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
	"github.com/gpumem/gpumem_exporter/simulate"
)

// The warning of docs/protocol.md end to end: instrumented processes (this
// test binary re-executed in the pusher role, one pid each, since the
// daemon warns every connection of a process) push their allocator state
// once a second in real time to the built exporter's socket; the one that
// leaks is warned on its own connection, in time and with an estimate close
// to the truth, and the ones that train steadily are not.

const (
	// pusherRole is the role (exportertest.RoleEnv) of a re-executed test
	// binary that runs pushClient.
	pusherRole = "pusher"
	// warnGPU is the simulated GPU every pusher reports on: the three
	// processes share it, as processes on one GPU do.
	warnGPU = 2
	// warnLimit is each pusher's per-process limit, which it reports in
	// its stats: the ceiling of the daemon's estimate (the simulated GPU
	// keeps far more than that free).
	warnLimit = 9 * attrGiB
	// warnRun is how long each pusher reports: the steady ones must get no
	// warning in that time.
	warnRun = 2 * time.Minute
	// warnAccuracy is how far a warning's eta_seconds may be from the
	// truth, as a share of the truth.
	warnAccuracy = 0.30
	// warnBeforeSeconds is what the pushers ask for in their hello.
	warnBeforeSeconds = 600
	// leakRate is how fast the leaking pusher's floor climbs, in bytes per
	// second of wall time: from 1 GiB it stays under its limit for the
	// whole run, and the first warning (after some 30 s of climb) foresees
	// the OOM some 2 minutes ahead, well under the threshold.
	leakRate = 48 << 20
)

// A shape is a process's active memory: at its n-th push, elapsed after
// its first.
type shape func(n int, elapsed time.Duration) uint64

// shapes are the pushers' workloads.
var shapes = map[string]shape{
	// leak: the floor climbs at leakRate from 1 GiB, each step of three
	// pushes adding a working set of up to 128 MiB on top.
	"leak": func(n int, elapsed time.Duration) uint64 {
		return attrGiB + uint64(elapsed.Seconds()*leakRate) + uint64(n%3)*(64<<20)
	},
	// flat: inference with a constant working set.
	"flat": func(int, time.Duration) uint64 { return 3 * attrGiB },
	// sawtooth: steady training: a flat floor of 2 GiB, each step of four
	// pushes rising to a peak of 2.5 to 3.25 GiB above it and back; the
	// peaks vary from step to step, as batches do.
	"sawtooth": func(n int, _ time.Duration) uint64 {
		peaks := [...]uint64{3 * attrGiB, 5 * attrGiB / 2, 13 * attrGiB / 4, 11 * attrGiB / 4}
		peak := peaks[(n/4)%len(peaks)]
		return 2*attrGiB + [...]uint64{0, peak / 2, peak, peak / 2}[n%4]
	},
}

// pusherEvent is one line a pusher prints: every line the daemon sends it
// ("line", with the truth the pusher knows when it arrives), and "done".
type pusherEvent struct {
	Event string `json:"event"`
	// Line is the daemon's line as received.
	Line string `json:"line,omitempty"`
	// Elapsed is the time since the first push when the line arrived (or
	// when the pusher stopped).
	Elapsed float64 `json:"elapsed_seconds"`
	// Pushes is how many stats messages were sent by then, and MaxLate
	// the most seconds one of them was sent after its second.
	Pushes  int     `json:"pushes"`
	MaxLate float64 `json:"max_late_seconds"`
	// TruthETA is, for the leak, the seconds until the peak of active
	// memory reaches the limit at leakRate, from the highest active of
	// the last step pushed (the last three pushes).
	TruthETA float64 `json:"truth_eta_seconds,omitempty"`
	// Peak is that highest active.
	Peak uint64 `json:"peak_bytes,omitempty"`
}

// pushClient is one instrumented process: it connects to GPUMEM_SOCKET,
// says hello asking for warnings under warnBeforeSeconds, and pushes the
// stats of the shape GPUMEM_TEST_SHAPE once a second for
// GPUMEM_TEST_DURATION, printing what the daemon sends it (pusherEvent,
// JSON lines) until it stops or stdin closes.
func pushClient(stdin io.Reader, stdout io.Writer) error {
	name := os.Getenv("GPUMEM_TEST_SHAPE")
	active, ok := shapes[name]
	if !ok {
		return fmt.Errorf("no shape %q", name)
	}
	run, err := time.ParseDuration(os.Getenv("GPUMEM_TEST_DURATION"))
	if err != nil {
		return err
	}
	conn, err := net.Dial("unix", os.Getenv("GPUMEM_SOCKET"))
	if err != nil {
		return err
	}
	defer conn.Close()
	hello := fmt.Sprintf(`{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-e2e/1","warn_before_seconds":%d}`+"\n", warnBeforeSeconds)
	if _, err := io.WriteString(conn, hello); err != nil {
		return err
	}

	var (
		mu     sync.Mutex
		out    = json.NewEncoder(stdout)
		first  time.Time
		pushed []uint64 // active of every push
		late   time.Duration
	)
	emit := func(ev pusherEvent) {
		mu.Lock()
		defer mu.Unlock()
		if !first.IsZero() {
			ev.Elapsed = time.Since(first).Seconds()
		}
		ev.Pushes, ev.MaxLate = len(pushed), late.Seconds()
		if n := len(pushed); name == "leak" && n > 0 {
			for _, v := range pushed[max(n-3, 0):] {
				ev.Peak = max(ev.Peak, v)
			}
			ev.TruthETA = float64(warnLimit-min(ev.Peak, warnLimit)) / leakRate
		}
		out.Encode(ev)
	}
	// Every line the daemon sends, the welcome first, as it arrives.
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		r := bufio.NewReader(conn)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			emit(pusherEvent{Event: "line", Line: strings.TrimSuffix(line, "\n")})
		}
	}()
	stop := make(chan struct{})
	go func() { io.Copy(io.Discard, stdin); close(stop) }()

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var reserved uint64
	for n := 0; ; n++ {
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		elapsed := time.Since(first)
		late = max(late, elapsed-time.Duration(n)*time.Second)
		a := active(n, elapsed)
		// A caching allocator keeps what it reserved at the peak.
		reserved = max(reserved, a)
		pushed = append(pushed, a)
		mu.Unlock()
		stats := fmt.Sprintf(`{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%d,"active_bytes":%d,"allocated_bytes":%d,"limit_bytes":%d}]}`+"\n",
			simulate.UUIDs[warnGPU], reserved, a, a, warnLimit)
		if _, err := io.WriteString(conn, stats); err != nil {
			return fmt.Errorf("push %d: %w", n, err)
		}
		if time.Since(first) >= run {
			break
		}
		select {
		case <-tick.C:
		case <-stop:
			return fmt.Errorf("stdin closed after %d pushes", n+1)
		}
	}
	// A warning decided on the last push has a moment to arrive.
	time.Sleep(time.Second)
	emit(pusherEvent{Event: "done"})
	conn.Close()
	<-readDone
	return nil
}

// pusher is one running pusher process.
type pusher struct {
	shape string
	cmd   *exec.Cmd
	out   *exportertest.SyncBuffer
	done  chan error
}

// startPusher starts a pusher of shape against socket.
func startPusher(t *testing.T, socket, shape string) *pusher {
	t.Helper()
	cmd := exportertest.RoleCommand(os.Args[0], pusherRole,
		"GPUMEM_SOCKET="+socket,
		"GPUMEM_TEST_SHAPE="+shape,
		"GPUMEM_TEST_DURATION="+warnRun.String(),
	)
	// Killed with the test binary, also where it dies of its -timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &pusher{shape: shape, cmd: cmd, out: &exportertest.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout = p.out
	var stderr exportertest.SyncBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the %s pusher: %v", shape, err)
	}
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%w; stderr: %s", err, stderr.String())
		}
		p.done <- err
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("%s pusher (pid %d) printed:\n%s", shape, cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// wait waits for the pusher to end (within timeout) and returns what it
// printed.
func (p *pusher) wait(t *testing.T, timeout time.Duration) []pusherEvent {
	t.Helper()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("the %s pusher failed: %v", p.shape, err)
		}
	case <-time.After(timeout):
		t.Fatalf("the %s pusher did not end within %s", p.shape, timeout)
	}
	var evs []pusherEvent
	for _, line := range strings.Split(strings.TrimSpace(p.out.String()), "\n") {
		var ev pusherEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("the %s pusher printed %q: %v", p.shape, line, err)
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 || evs[len(evs)-1].Event != "done" {
		t.Fatalf("the %s pusher did not finish its run:\n%s", p.shape, p.out.String())
	}
	return evs
}

// warningFields are the fields docs/protocol.md lists for a warning.
var warningFields = []string{"v", "type", "gpu", "uuid", "eta_seconds", "climb_bytes_per_minute", "active_bytes", "ceiling_bytes", "ceiling", "climb_seconds", "cause", "summary", "remedy"}

// verdictCauses is the verdicts' set of causes (docs/oom.md).
var verdictCauses = []string{"limit", "fragmentation", "neighbours", "too_large", "leak", "growth", "contexts", "unknown"}

// TestWarningForeseesALeakAndSparesSteadyTraining: three processes report
// on one GPU of the simulated node, concurrently, once a second for two
// minutes, under a limit of 9 GiB. The one whose floor climbs (a leak) gets
// a warning on its own connection, cause leak, whose eta_seconds is within
// 30 % of the truth when it arrives, no more than one a minute; one with a
// flat working set and one training steadily (a sawtooth over a flat floor)
// get none.
//
// Not parallel: it runs alone, before the parallel tests, whose scrapes and
// Prometheus servers its three clients and two minutes would otherwise
// slow (TestShardsAndGlobalViewMatchOnePrometheus compares scrapes that
// time out under load).
func TestWarningForeseesALeakAndSparesSteadyTraining(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the clients report for two minutes in real time")
	}
	// The load scenario with one small process a GPU: the simulated GPU
	// keeps far more free than the pushers' limit, which is then their
	// ceiling. --allocstats.warn-before stays at its default.
	e := startExporter(t, "--nvml.simulated.scenario=load", "--nvml.simulated.processes-per-gpu=1")
	e.WaitReady(t)
	pushers := map[string]*pusher{}
	for _, s := range []string{"leak", "flat", "sawtooth"} {
		pushers[s] = startPusher(t, e.Socket, s)
	}
	// Each ends on its own after warnRun; the slack is for a loaded machine.
	timeout := warnRun + time.Minute
	got := map[string][]pusherEvent{}
	for s, p := range pushers {
		got[s] = p.wait(t, timeout)
	}

	for s, evs := range got {
		welcome, warnings, others := sortLines(t, s, evs)
		checkWelcome(t, s, welcome)
		if len(others) > 0 {
			t.Errorf("the %s pusher got lines that are neither a welcome nor a warning: %q", s, others)
		}
		if s != "leak" {
			for _, w := range warnings {
				t.Errorf("the %s pusher was warned %.0f s into its run: %s", s, w.Elapsed, w.Line)
			}
			continue
		}
		if len(warnings) == 0 {
			t.Fatalf("the leaking pusher got no warning in %d pushes (last truth: OOM in %.0f s, under the threshold of %d s)",
				evs[len(evs)-1].Pushes, evs[len(evs)-1].TruthETA, warnBeforeSeconds)
		}
		for i, w := range warnings {
			checkLeakWarning(t, w)
			if i > 0 {
				// On the daemon's clock a minute apart at least; the
				// arrivals may differ from it by a little.
				if gap := w.Elapsed - warnings[i-1].Elapsed; gap < 55 {
					t.Errorf("two warnings %.1f s apart (at %.1f s and %.1f s), want one a minute at most", gap, warnings[i-1].Elapsed, w.Elapsed)
				}
			}
		}
		t.Logf("the leaking pusher was warned %d times (pushes up to %.2f s late); first at %.1f s, truth %.1f s: %s",
			len(warnings), evs[len(evs)-1].MaxLate, warnings[0].Elapsed, warnings[0].TruthETA, warnings[0].Line)
	}
}

// sortLines splits what a pusher received into its welcome, its warnings
// and any other line.
func sortLines(t *testing.T, shape string, evs []pusherEvent) (welcome map[string]any, warnings []pusherEvent, others []string) {
	t.Helper()
	for _, ev := range evs {
		if ev.Event != "line" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ev.Line), &m); err != nil {
			t.Errorf("the %s pusher got a line that is not JSON: %q", shape, ev.Line)
			continue
		}
		switch m["type"] {
		case "welcome":
			if welcome != nil {
				t.Errorf("the %s pusher got a second welcome: %s", shape, ev.Line)
			}
			welcome = m
		case "warning":
			warnings = append(warnings, ev)
		default:
			others = append(others, ev.Line)
		}
	}
	return welcome, warnings, others
}

// checkWelcome: the welcome advertises the daemon's own threshold, its
// default --allocstats.warn-before of 10 minutes.
func checkWelcome(t *testing.T, shape string, welcome map[string]any) {
	t.Helper()
	if welcome == nil {
		t.Errorf("the %s pusher got no welcome", shape)
		return
	}
	if w, ok := welcome["warn_before_seconds"].(float64); !ok || w != 600 {
		t.Errorf("the %s pusher's welcome has warn_before_seconds %v, want 600 (the default --allocstats.warn-before of 10m)", shape, welcome["warn_before_seconds"])
	}
}

// checkLeakWarning checks a warning the leaking pusher got: every field of
// docs/protocol.md, its GPU, the limit as the ceiling, cause leak, and an
// estimate and a climb within warnAccuracy of the truth.
func checkLeakWarning(t *testing.T, ev pusherEvent) {
	t.Helper()
	var w map[string]any
	if err := json.Unmarshal([]byte(ev.Line), &w); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, f := range warningFields {
		if _, ok := w[f]; !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		t.Errorf("the warning at %.1f s lacks %s: %s", ev.Elapsed, strings.Join(missing, ", "), ev.Line)
	}
	num := func(f string) float64 { v, _ := w[f].(float64); return v }
	str := func(f string) string { v, _ := w[f].(string); return v }
	if w["v"] != float64(1) || str("gpu") != strconv.Itoa(warnGPU) || str("uuid") != simulate.UUIDs[warnGPU] {
		t.Errorf("the warning names v %v, GPU %q, UUID %q; want 1, %d, %s", w["v"], str("gpu"), str("uuid"), warnGPU, simulate.UUIDs[warnGPU])
	}
	cause := str("cause")
	known := false
	for _, c := range verdictCauses {
		known = known || c == cause
	}
	if !known || cause != "leak" {
		t.Errorf("the warning's cause is %q, want leak (of the verdicts' set %v)", cause, verdictCauses)
	}
	if str("ceiling") != "limit" || num("ceiling_bytes") != float64(warnLimit) {
		t.Errorf("the warning's ceiling is %q of %.0f bytes, want the limit of %d", str("ceiling"), num("ceiling_bytes"), uint64(warnLimit))
	}
	if strings.TrimSpace(str("summary")) == "" || strings.TrimSpace(str("remedy")) == "" {
		t.Errorf("the warning has an empty summary or remedy: %s", ev.Line)
	}
	if eta := num("eta_seconds"); !within(eta, ev.TruthETA, warnAccuracy) {
		t.Errorf("the warning at %.1f s foresees the OOM in %.0f s; the truth then was %.1f s (peak %d bytes, limit %d, %d bytes a second; pushes up to %.2f s late): off by %.0f %%, more than %.0f %%",
			ev.Elapsed, eta, ev.TruthETA, ev.Peak, uint64(warnLimit), leakRate, ev.MaxLate, 100*math.Abs(eta-ev.TruthETA)/ev.TruthETA, 100*warnAccuracy)
	}
	if climb := num("climb_bytes_per_minute"); !within(climb, 60*leakRate, warnAccuracy) {
		t.Errorf("the warning's climb is %.0f bytes a minute, want %d within %.0f %%", climb, 60*leakRate, 100*warnAccuracy)
	}
}

// within says whether got is within share of want.
func within(got, want, share float64) bool {
	return want > 0 && math.Abs(got-want) <= share*want
}
