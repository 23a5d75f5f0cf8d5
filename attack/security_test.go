package attack

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
	"github.com/gpumem/gpumem_exporter/simulate"
)

// The attacks of docs/security.md as end-to-end tests (see doc.go).
//
// Tests that share no state run in parallel. Three do not:
// TestSecurityPidReuseAcrossUsers forces pids through ns_last_pid, which
// any process started beside it would disturb; TestSecurityIdleHTTPFlood
// and TestAttackAllAtOnceStaysUnderTheMemoryRequest report scrape latency
// and peak RSS, which other tests' load would skew.

const (
	attackerUID = 65534 // nobody
	victimUID   = 1000
	victimGPU   = 6
	evilBytes   = 82700000000
)

// runAttacker connects GPUMEM_TEST_CONNS times to GPUMEM_SOCKET, hands
// every connection to the parent over fd 3 (SCM_RIGHTS) and exits at once:
// the parent keeps connections whose process is gone.
func runAttacker() int {
	n, _ := strconv.Atoi(os.Getenv("GPUMEM_TEST_CONNS"))
	for i := 0; i < n; i++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return 1
		}
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: os.Getenv("GPUMEM_SOCKET")}); err != nil {
			unix.Close(fd)
			continue
		}
		if err := unix.Sendmsg(3, []byte{0}, unix.UnixRights(fd), nil, 0); err != nil {
			return 1
		}
		unix.Close(fd)
	}
	return 0
}

// runVictim is a well-behaved client: after "go" on stdin, hello, then the
// stats of one GPU (GPUMEM_TEST_RESERVED bytes), "ready" on stdout; each
// "again N" line on stdin sends the stats again with N bytes and answers
// "sent". It exits when stdin closes.
func runVictim() int {
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return 1
	}
	conn, err := net.Dial("unix", os.Getenv("GPUMEM_SOCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	stats := func(reserved string) error {
		_, err := fmt.Fprintf(conn, `{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%s,"active_bytes":0}]}`+"\n", simulate.UUIDs[victimGPU], reserved)
		return err
	}
	io.WriteString(conn, `{"v":1,"type":"hello","framework":"pytorch","client":"victim/1"}`+"\n")
	// A process over the daemon's limits gets no welcome: do not insist.
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	bufio.NewReader(conn).ReadString('\n')
	if err := stats(os.Getenv("GPUMEM_TEST_RESERVED")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	for in.Scan() {
		if v, ok := strings.CutPrefix(in.Text(), "again "); ok {
			if err := stats(v); err != nil {
				fmt.Println("failed:", err)
				continue
			}
			fmt.Println("sent")
		}
	}
	return 0
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs processes as other users")
	}
}

// sharedCopy is bin where other users can run it (the build and cache
// directories are private to root): a link, or a copy, in a directory
// removed when the test ends.
func sharedCopy(t *testing.T, bin string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpumem-sec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(bin))
	if err := os.Link(bin, dst); err != nil {
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// sharedTestBinary is this test binary, runnable by other users.
func sharedTestBinary(t *testing.T) string {
	t.Helper()
	return sharedCopy(t, os.Args[0])
}

// roleCommand runs bin as role under uid.
func roleCommand(bin, role string, uid int, env ...string) *exec.Cmd {
	cmd := asUser(exportertest.RoleCommand(bin, role, env...), uid)
	cmd.Stderr = os.Stderr
	return cmd
}

// asUser makes cmd run as uid (and the group of the same number).
func asUser(cmd *exec.Cmd, uid int) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	return cmd
}

// openToAll lets other users reach the exporter's socket.
func openToAll(t *testing.T, e *exportertest.Exporter) {
	t.Helper()
	if err := os.Chmod(filepath.Dir(e.Socket), 0o755); err != nil {
		t.Fatal(err)
	}
}

// victim is a running well-behaved client of another user.
type victim struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	reply chan string
}

// startVictim starts cmd (the sec-victim role); go lets it connect.
func startVictim(t *testing.T, cmd *exec.Cmd) *victim {
	t.Helper()
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	v := &victim{cmd: cmd, in: in, out: bufio.NewReader(out), reply: make(chan string, 16)}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a victim: %v", err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	go func() {
		for {
			line, err := v.out.ReadString('\n')
			if err != nil {
				close(v.reply)
				return
			}
			v.reply <- strings.TrimSpace(line)
		}
	}()
	return v
}

// goAhead lets the victim connect, and waits until it has reported.
func (v *victim) goAhead(t *testing.T) {
	t.Helper()
	fmt.Fprintln(v.in, "go")
	v.expect(t, "ready")
}

func (v *victim) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-v.reply:
		if got != want {
			t.Fatalf("victim pid %d said %q, want %q", v.cmd.Process.Pid, got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("victim pid %d did not say %q within 10 s", v.cmd.Process.Pid, want)
	}
}

// forcePID starts cmd so that it gets pid (writing ns_last_pid, as CRIU
// does), retrying when another process takes the pid first. It reports
// whether the pid was reused; if it cannot be forced cmd still runs.
func forcePID(t *testing.T, pid int, mk func() *exec.Cmd) (*victim, bool) {
	t.Helper()
	for try := 0; try < 20; try++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			break
		}
		cmd := mk()
		v := startVictim(t, cmd)
		if cmd.Process.Pid == pid {
			return v, true
		}
		v.in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}
	return startVictim(t, mk()), false
}

// receiveFDs reads n descriptors sent with SCM_RIGHTS on fd, one a
// message, until EOF.
func receiveFDs(t *testing.T, fd int) []int {
	t.Helper()
	var fds []int
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil || (n == 0 && oobn == 0) {
			return fds
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err != nil {
				t.Fatal(err)
			}
			fds = append(fds, got...)
		}
	}
}

// waitClosedByPeer waits until the daemon has closed the connection fd (a
// read gives EOF or an error), so that everything written on it has been
// handled.
func waitClosedByPeer(fd int, deadline time.Time) bool {
	tv := unix.NsecToTimeval(int64(time.Until(deadline)))
	if tv.Sec < 0 || (tv.Sec == 0 && tv.Usec <= 0) {
		return false
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 256)
	for {
		n, err := unix.Read(fd, buf)
		if n == 0 && err == nil {
			return true // EOF
		}
		if err != nil {
			return !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR)
		}
	}
}

// TestSecurityPidReuseAcrossUsers: a user (nobody) forks children that
// connect and exit at once, keeps their connections, and writes on them
// once each pid belongs to another user's process: series, framework and
// OOM reports of that process. Zero writes may land in 1000 attempts, and
// the victims' own connections keep working (the eviction path).
func TestSecurityPidReuseAcrossUsers(t *testing.T) {
	requireRoot(t)
	const rounds, perRound = 5, 200
	e := startExporter(t, "--allocstats.max-connections-per-uid=256")
	e.WaitReady(t)
	openToAll(t, e)
	bin := sharedTestBinary(t)

	var stale []int
	t.Cleanup(func() {
		for _, fd := range stale {
			unix.Close(fd)
		}
	})
	var victims []*victim
	reused := 0
	for r := 0; r < rounds; r++ {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		child := os.NewFile(uintptr(pair[1]), "fds")
		attacker := roleCommand(bin, "sec-attacker", attackerUID, "GPUMEM_SOCKET="+e.Socket, "GPUMEM_TEST_CONNS="+strconv.Itoa(perRound))
		attacker.ExtraFiles = []*os.File{child}
		if err := attacker.Start(); err != nil {
			t.Fatal(err)
		}
		child.Close()
		fds := receiveFDs(t, pair[0])
		unix.Close(pair[0])
		if err := attacker.Wait(); err != nil {
			t.Fatalf("attacker: %v", err)
		}
		stale = append(stale, fds...)
		pid := attacker.Process.Pid
		v, ok := forcePID(t, pid, func() *exec.Cmd {
			return roleCommand(bin, "sec-victim", victimUID, "GPUMEM_SOCKET="+e.Socket, "GPUMEM_TEST_RESERVED=1073741824")
		})
		v.goAhead(t)
		if ok {
			reused++
		}
		victims = append(victims, v)
		// The victim now holds the pid the stale connections were opened by.
		for _, fd := range fds {
			for _, line := range []string{
				`{"v":1,"type":"hello","framework":"EVIL"}`,
				fmt.Sprintf(`{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%d}]}`, simulate.UUIDs[victimGPU], uint64(evilBytes)),
				fmt.Sprintf(`{"v":1,"type":"oom","uuid":%q,"requested_bytes":%d}`, simulate.UUIDs[victimGPU], uint64(evilBytes)),
			} {
				unix.Sendto(fd, []byte(line+"\n"), unix.MSG_NOSIGNAL, nil)
			}
		}
	}
	t.Logf("%d attempts over %d rounds; the pid was reused by another user's process in %d rounds", len(stale), rounds, reused)
	if reused == 0 {
		t.Log("could not force pid reuse (ns_last_pid); the stale connections were still tested")
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, fd := range stale {
		if !waitClosedByPeer(fd, deadline) {
			t.Fatal("a connection of an exited process was not closed by the daemon within 5 s")
		}
	}
	// The victims' connections still work.
	for _, v := range victims {
		fmt.Fprintln(v.in, "again 2147483648")
		v.expect(t, "sent")
	}
	var body string
	exportertest.Eventually(t, 5*time.Second, "every victim's new stats", func() bool {
		_, body = e.Get(t, "/metrics")
		for _, v := range victims {
			re := fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, v.cmd.Process.Pid)
			if exportertest.MetricIn(body, re) != 2147483648 {
				return false
			}
		}
		return true
	})
	okLines := exportertest.SumMetric(body, `gpumem_allocstats_messages_total\{result="ok",type="[a-z]+"\}`)
	if want := float64(3 * rounds); okLines != want {
		t.Errorf("%v messages accepted, want only the victims' %v: %v cross-user writes in %d attempts", okLines, want, okLines-want, len(stale))
	}
	if strings.Contains(body, `framework="EVIL"`) || strings.Contains(body, "8.27e+10") {
		t.Errorf("the attacker's lines reached /metrics:\n%s", exportertest.GrepLines(body, "EVIL", "8.27e+10"))
	}
	_, reports := e.Get(t, "/api/v1/oom-reports")
	for _, v := range victims {
		if strings.Contains(reports, fmt.Sprintf(`"pid":%d,`, v.cmd.Process.Pid)) && strings.Contains(reports, strconv.Itoa(evilBytes)) {
			t.Errorf("an OOM report was forged for victim pid %d", v.cmd.Process.Pid)
		}
	}
}

// TestSecuritySlotExhaustionAndSeriesFlood: one user takes every
// connection it can and runs more reporting processes than allowed; another
// user is still served, and the first user's series stay bounded.
func TestSecuritySlotExhaustionAndSeriesFlood(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	e := startExporter(t, "--allocstats.max-connections-per-uid=16", "--allocstats.max-processes-per-uid=2")
	e.WaitReady(t)
	openToAll(t, e)
	bin := sharedTestBinary(t)
	// This process (root) opens 200 connections: 16 are kept.
	var conns []net.Conn
	for i := 0; i < 200; i++ {
		c, err := net.Dial("unix", e.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	exportertest.Eventually(t, 5*time.Second, "the per-uid rejections", func() bool {
		return e.Metric(t, `gpumem_allocstats_connections_rejected_total\{reason="max_connections_per_uid"\}`) >= 200-16
	})
	// Four processes of nobody report at once: two are kept. (The two
	// over the cap wait for a welcome that does not come; together.)
	var flood []*victim
	for i := 0; i < 4; i++ {
		v := startVictim(t, roleCommand(bin, "sec-victim", attackerUID, "GPUMEM_SOCKET="+e.Socket, "GPUMEM_TEST_RESERVED=1000"))
		fmt.Fprintln(v.in, "go")
		flood = append(flood, v)
	}
	for _, v := range flood {
		v.expect(t, "ready")
	}
	// Another user is served.
	good := startVictim(t, roleCommand(bin, "sec-victim", victimUID, "GPUMEM_SOCKET="+e.Socket, "GPUMEM_TEST_RESERVED=4096"))
	good.goAhead(t)
	var body string
	exportertest.Eventually(t, 5*time.Second, "the other user's series", func() bool {
		_, body = e.Get(t, "/metrics")
		return exportertest.MetricIn(body, fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, good.cmd.Process.Pid)) == 4096
	})
	kept := 0
	for _, v := range flood {
		if exportertest.MetricIn(body, fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, v.cmd.Process.Pid)) == 1000 {
			kept++
		}
	}
	if kept != 2 {
		t.Errorf("%d of nobody's 4 reporting processes have series, want the cap of 2", kept)
	}
}

// TestSecurityOOMFloodAndBlame: 5000 oom lines from one process make one
// report; a process NVML does not list, claiming 2^64-1 bytes, is clamped
// to the GPU's memory and never ranks as the top holder.
func TestSecurityOOMFloodAndBlame(t *testing.T) {
	t.Parallel()
	e := startExporter(t)
	e.WaitReady(t)
	c := e.Dial(t)
	w := bufio.NewWriter(c)
	uuid := simulate.UUIDs[victimGPU]
	fmt.Fprintf(w, `{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":18446744073709551615,"active_bytes":18446744073709551615}]}`+"\n", uuid)
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(w, `{"v":1,"type":"oom","uuid":%q,"requested_bytes":%d}`+"\n", uuid, 1000+i)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	exportertest.Eventually(t, 10*time.Second, "every oom line handled", func() bool {
		return e.Metric(t, `gpumem_allocstats_messages_total\{result="ok",type="oom"\}`) == 5000
	})
	var mine []map[string]any
	exportertest.Eventually(t, 5*time.Second, "the one report", func() bool {
		_, body := e.Get(t, "/api/v1/oom-reports")
		var got struct {
			Reports []map[string]any `json:"reports"`
		}
		if json.Unmarshal([]byte(body), &got) != nil {
			return false
		}
		mine = nil
		for _, r := range got.Reports {
			if r["pid"] == float64(os.Getpid()) {
				mine = append(mine, r)
			}
		}
		return len(mine) > 0
	})
	if len(mine) != 1 {
		t.Errorf("5000 oom lines from one process kept %d reports, want 1", len(mine))
	}
	if got := e.Metric(t, `gpumem_oom_reports_dropped_total\{reason="pid_rate"\}`); got < 4999 {
		t.Errorf("gpumem_oom_reports_dropped_total{reason=\"pid_rate\"} = %v, want at least 4999", got)
	}
	rep, _ := json.Marshal(mine[0])
	if strings.Contains(string(rep), "18446744073709551615") {
		t.Errorf("the report carries the unclamped claim: %s", rep)
	}
	procs, _ := mine[0]["processes"].([]any)
	if len(procs) > 1 {
		if top := procs[0].(map[string]any); top["nvml_listed"] != true {
			t.Errorf("a process NVML does not list ranks first: %v", top)
		}
	}
	if strings.Contains(e.Log.String(), "top_holder_pid="+strconv.Itoa(os.Getpid())) {
		t.Error("the log names the unlisted process as the top holder")
	}
	total := e.Metric(t, fmt.Sprintf(`gpumem_gpu_memory_total_bytes\{gpu="%d",uuid="%s"\}`, victimGPU, uuid))
	got := e.Metric(t, fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, os.Getpid()))
	if total <= 0 || got != total {
		t.Errorf("claimed reserved exported as %v, want clamped to the GPU's %v", got, total)
	}
}

// TestSecurityIdleHTTPFlood: a thousand idle TCP connections do not keep
// scrapes out, and the exporter's descriptors stay bounded.
func TestSecurityIdleHTTPFlood(t *testing.T) {
	e := startExporter(t, "--web.max-connections=64")
	e.WaitReady(t)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := 0; i < 1000; i++ {
		c, err := net.Dial("tcp", e.Addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		idle = append(idle, c)
	}
	// Prometheus-style scrapes: a new connection each time (the scraper's
	// keep-alive connection was closed as idle), a 10 s timeout.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var slowest time.Duration
	for i := 0; i < 20; i++ {
		start := time.Now()
		resp, err := client.Get("http://" + e.Addr + "/metrics")
		if err != nil {
			t.Fatalf("scrape %d under an idle flood: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "gpumem_gpu_info") {
			t.Fatalf("scrape %d: %d", i, resp.StatusCode)
		}
		slowest = max(slowest, time.Since(start))
		// More idle connections keep arriving.
		if c, err := net.Dial("tcp", e.Addr); err == nil {
			idle = append(idle, c)
		}
	}
	t.Logf("slowest of 20 scrapes under %d idle connections: %s", len(idle), slowest)
	if slowest > 3*time.Second {
		t.Errorf("slowest scrape took %s, want well under the 10 s scrape timeout", slowest)
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.Pid()))
	if err == nil && len(ents) > 64+64 {
		t.Errorf("the exporter holds %d descriptors under the flood, want about --web.max-connections plus its own", len(ents))
	}
}

// TestSecurityLogFlood: bad lines over thousands of connections give a
// bounded number of warn lines; the rest are counted as suppressed.
func TestSecurityLogFlood(t *testing.T) {
	t.Parallel()
	e := startExporter(t, "--allocstats.max-connections-per-uid=1024")
	e.WaitReady(t)
	const n = 5000
	start := time.Now()
	var wg sync.WaitGroup
	var sent atomic.Int32
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/8; i++ {
				c, err := net.Dial("unix", e.Socket)
				if err != nil {
					continue
				}
				if _, err := io.WriteString(c, "not json\n"); err == nil {
					sent.Add(1)
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	// Every line written is counted as malformed, unless its connection
	// was refused (the backlog full, a cap reached).
	var handled, refused float64
	exportertest.Eventually(t, 30*time.Second, "every bad line counted", func() bool {
		body := e.Scrape(t)
		handled = exportertest.MetricIn(body, `gpumem_allocstats_messages_total\{result="malformed",type="unknown"\}`)
		refused = exportertest.SumMetric(body, `gpumem_allocstats_connections_rejected_total\{reason="[a-z_]+"\}`)
		return handled+refused >= float64(sent.Load())
	})
	elapsed := time.Since(start)
	// Each counted line was either logged at warn or counted as
	// suppressed; the log reaches us through a pipe, so wait for it.
	var warns int
	var suppressed float64
	exportertest.Eventually(t, 5*time.Second, "warn lines and suppressed lines adding up to the bad lines", func() bool {
		warns = strings.Count(e.Log.String(), `msg="Bad allocstats message"`)
		suppressed = e.Metric(t, `gpumem_log_messages_suppressed_total\{path="allocstats_bad_message"\}`)
		return float64(warns)+suppressed == handled
	})
	// A burst of 10, then one per 6 s.
	if limit := 10 + int(elapsed/(6*time.Second)) + 1; warns > limit {
		t.Errorf("%d warn lines for %v bad lines in %s, want at most %d", warns, handled, elapsed.Round(time.Millisecond), limit)
	}
	t.Logf("%d bad lines written over %d connections (%v refused) in %s: %d warn lines, %v suppressed", sent.Load(), n, refused, elapsed.Round(time.Millisecond), warns, suppressed)
}

// TestSecuritySquattedFallbackDirectory: a daemon without root falls back
// to $XDG_RUNTIME_DIR/gpumem or $TMPDIR/gpumem-<uid>, and refuses both when
// another user made them first.
func TestSecuritySquattedFallbackDirectory(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	if _, err := os.Stat("/run/gpumem"); err == nil {
		if fi, _ := os.Stat("/run/gpumem"); fi.Mode().Perm()&0o002 != 0 {
			t.Skip("/run/gpumem is world-writable here: the daemon would not fall back")
		}
	}
	exporterPath, _ := exporterBinary(t)
	bin := sharedCopy(t, exporterPath)
	base := exportertest.ShortTempDir(t)
	os.Chmod(base, 0o755)
	xdg, tmp := filepath.Join(base, "xdg"), filepath.Join(base, "tmp")
	for _, d := range []struct {
		path  string
		mode  os.FileMode
		owner int
	}{
		{xdg, 0o700, victimUID},
		{tmp, 0o1777, 0},
		{filepath.Join(xdg, "gpumem"), 0o755, attackerUID},
		{filepath.Join(tmp, fmt.Sprintf("gpumem-%d", victimUID)), 0o755, attackerUID},
	} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d.path, d.mode)
		os.Chown(d.path, d.owner, d.owner)
	}
	// run starts the daemon as the victim user and waits until it either
	// exits or serves HTTP (then stops it): its output, whether it served,
	// and its exit status.
	run := func() (out string, served bool, err error) {
		cmd := asUser(exec.Command(bin, "--nvml.backend=simulated", "--web.listen-address=127.0.0.1:0"), victimUID)
		cmd.Env = exportertest.ChildEnv("XDG_RUNTIME_DIR="+xdg, "TMPDIR="+tmp)
		var log exportertest.SyncBuffer
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { cmd.Process.Kill() })
		exited := false
		exportertest.Eventually(t, 15*time.Second, "exit or HTTP listener of the daemon", func() bool {
			select {
			case err = <-done:
				exited = true
				return true
			default:
				return strings.Contains(log.String(), `msg="Listening on"`)
			}
		})
		if !exited {
			cmd.Process.Signal(os.Interrupt)
			err = <-done
		}
		if exportertest.RaceReported(err) {
			t.Errorf("the race detector found a race in the exporter:\n%s", log.String())
		}
		return log.String(), !exited, err
	}
	out, served, err := run()
	if served || err == nil {
		t.Fatalf("the daemon started with both fallback directories squatted by uid %d:\n%s", attackerUID, out)
	}
	if !strings.Contains(out, "not a directory owned by uid") {
		t.Errorf("the refusal does not say why:\n%s", out)
	}
	// Once the XDG directory is the daemon's own, it is used.
	os.Chown(filepath.Join(xdg, "gpumem"), victimUID, victimUID)
	out, served, err = run()
	if !served || err != nil || !strings.Contains(out, filepath.Join(xdg, "gpumem", "allocstats.sock")) {
		t.Errorf("with its own XDG directory: served %v, exit %v\n%s", served, err, out)
	}
}

// TestSecuritySocketVanishes: a deleted socket is recreated; one that
// cannot be recreated turns /-/ready red until it can.
func TestSecuritySocketVanishes(t *testing.T) {
	t.Parallel()
	e := startExporter(t)
	e.WaitReady(t)
	if err := os.Remove(e.Socket); err != nil {
		t.Fatal(err)
	}
	exportertest.Eventually(t, 5*time.Second, "the socket recreated", func() bool {
		c, err := net.Dial("unix", e.Socket)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	// Something else takes the path: ready goes red, then green again.
	os.Remove(e.Socket)
	if err := os.Mkdir(e.Socket, 0o755); err != nil {
		t.Fatal(err)
	}
	exportertest.Eventually(t, 5*time.Second, "/-/ready red", func() bool { code, _ := e.Get(t, "/-/ready"); return code == http.StatusServiceUnavailable })
	os.Remove(e.Socket)
	exportertest.Eventually(t, 5*time.Second, "/-/ready green again", func() bool { code, _ := e.Get(t, "/-/ready"); return code == 200 })
}

// memoryRequest is the DaemonSet's memory request (deploy/kubernetes).
const memoryRequest = 96 << 20

// procStatusBytes reads a "Vm…:" line of /proc/<pid>/status, in bytes.
func procStatusBytes(t *testing.T, pid int, field string) uint64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + field + `:\s+(\d+) kB$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("no %s in /proc/%d/status", field, pid)
	}
	v, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return v << 10
}

// TestAttackAllAtOnceStaysUnderTheMemoryRequest runs the floods together
// against one exporter: unfinished 64 KiB lines on a thousand connections
// (the per-uid cap raised, as if from many users), an OOM flood, a log
// flood and a thousand idle HTTP connections. A well-behaved client keeps
// reporting and sees its values in /metrics throughout, and the exporter's
// peak RSS stays under the DaemonSet's memory request (checked without the
// race detector, which multiplies memory use; docs/security.md has the
// figures). GPUMEM_ATTACK_EXPORTER=path measures that build.
func TestAttackAllAtOnceStaysUnderTheMemoryRequest(t *testing.T) {
	_, race := exporterBinary(t)
	e := startExporter(t, "--allocstats.max-connections-per-uid=1024", "--allocstats.max-connections=1100")
	e.WaitReady(t)
	pid := e.Pid()
	for i := 0; i < 5; i++ {
		e.Get(t, "/metrics")
	}
	baseline := procStatusBytes(t, pid, "VmRSS")

	good := e.Dial(t)
	var conns []net.Conn
	var connsMu sync.Mutex
	keep := func(c net.Conn) {
		connsMu.Lock()
		conns = append(conns, c)
		connsMu.Unlock()
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(4)
	go func() { // unfinished lines just under the message limit
		defer wg.Done()
		line := []byte(`{"v":1,"type":"hello","pad":"` + strings.Repeat("x", 64<<10-40))
		for i := 0; i < 1000; i++ {
			c, err := net.Dial("unix", e.Socket)
			if err != nil {
				continue
			}
			keep(c)
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write(line)
		}
	}()
	go func() { // an OOM flood
		defer wg.Done()
		c, err := net.Dial("unix", e.Socket)
		if err != nil {
			return
		}
		keep(c)
		w := bufio.NewWriter(c)
		for i := 0; i < 5000; i++ {
			fmt.Fprintf(w, `{"v":1,"type":"oom","uuid":%q,"requested_bytes":%d}`+"\n", simulate.UUIDs[1], i)
		}
		w.Flush()
	}()
	go func() { // a log flood
		defer wg.Done()
		for i := 0; i < 2000; i++ {
			c, err := net.Dial("unix", e.Socket)
			if err != nil {
				continue
			}
			io.WriteString(c, "garbage\n")
			c.Close()
		}
	}()
	go func() { // idle HTTP connections
		defer wg.Done()
		for i := 0; i < 1000; i++ {
			if c, err := net.Dial("tcp", e.Addr); err == nil {
				keep(c)
			}
		}
	}()
	// The well-behaved client reports throughout, and is seen.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	served := 0
	for i := 1; ; i++ {
		reserved := 1000 + i
		if _, err := fmt.Fprintf(good, `{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%d}]}`+"\n", simulate.UUIDs[2], reserved); err != nil {
			t.Fatalf("the well-behaved client's connection failed under the attacks: %v", err)
		}
		re := fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*uuid="%s"[^}]*\}`, os.Getpid(), simulate.UUIDs[2])
		seen := exportertest.Within(5*time.Second, func() bool {
			resp, err := client.Get("http://" + e.Addr + "/metrics")
			if err != nil {
				return false
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return exportertest.MetricIn(string(body), re) == float64(reserved)
		})
		if !seen {
			t.Fatalf("the well-behaved client's report %d did not show in /metrics within 5 s under the attacks", i)
		}
		served++
		select {
		case <-done:
		default:
			continue
		}
		break
	}
	elapsed := time.Since(start)
	// Let the OOM flood and the evictions finish, then read the peak.
	exportertest.Eventually(t, 10*time.Second, "the OOM flood handled", func() bool {
		return e.Metric(t, `gpumem_allocstats_messages_total\{result="ok",type="oom"\}`) == 5000
	})
	_, body := e.Get(t, "/metrics")
	peak := procStatusBytes(t, pid, "VmHWM")
	rss := procStatusBytes(t, pid, "VmRSS")
	t.Logf("RSS before %.1f MiB, after %.1f MiB, peak %.1f MiB (request %d MiB, race detector %v); attacks ran %s, the good client was served %d times; connections closed for the buffer budget: %v, OOM reports dropped: %v, log lines suppressed: %v",
		float64(baseline)/(1<<20), float64(rss)/(1<<20), float64(peak)/(1<<20), memoryRequest>>20, race, elapsed.Round(time.Millisecond), served,
		exportertest.MetricIn(body, `gpumem_allocstats_connections_closed_total\{reason="buffer_budget"\}`),
		exportertest.SumMetric(body, `gpumem_oom_reports_dropped_total\{reason="[a-z_]+"\}`),
		exportertest.SumMetric(body, `gpumem_log_messages_suppressed_total\{path="[a-z_]+"\}`))
	if !race && peak >= memoryRequest {
		t.Errorf("peak RSS %.1f MiB under every attack at once, want under the %d MiB request", float64(peak)/(1<<20), memoryRequest>>20)
	}
}
