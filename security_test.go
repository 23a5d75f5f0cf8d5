package main

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

	"github.com/prometheus/exporter-toolkit/web"
	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem_exporter/simulate"
)

// The attacks of docs/security.md as end-to-end tests: the exporter runs as
// its own process (simulated backend), attackers and victims are this test
// binary re-executed under other uids, and everything goes over loopback
// and the socket. Run them with
//
//	go test -race -count=1 -run 'Security|Attack' .
//
// Most need root (to run processes as other users, and to force a pid to
// be reused); they skip without it.

const (
	attackerUID = 65534 // nobody
	victimUID   = 1000
	victimGPU   = 6
	evilBytes   = 82700000000
)

func init() {
	extraRoles["sec-attacker"] = runAttacker
	extraRoles["sec-victim"] = runVictim
}

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

// sharedBinary is this test binary where other users can run it (the
// build directory is private to root).
func sharedBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpumem-sec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "gpumem_exporter.test")
	if err := os.Link(binary, dst); err != nil {
		data, err := os.ReadFile(binary)
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

// roleCommand runs bin as role under uid.
func roleCommand(bin, role string, uid int, env ...string) *exec.Cmd {
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), roleEnv+"="+role), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	cmd.Stderr = os.Stderr
	return cmd
}

// openToAll lets other users reach the exporter's socket.
func (e *exporter) openToAll(t *testing.T) {
	t.Helper()
	if err := os.Chmod(filepath.Dir(e.socket), 0o755); err != nil {
		t.Fatal(err)
	}
}

// metric returns the value of the first series of /metrics matching re
// (a regexp on the whole line before the value), or -1.
func (e *exporter) metric(t *testing.T, re string) float64 {
	t.Helper()
	_, body := e.get(t, "/metrics")
	return metricIn(body, re)
}

func metricIn(body, re string) float64 {
	m := regexp.MustCompile(`(?m)^` + re + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// sumMetric sums every series of a family matching re.
func sumMetric(body, re string) float64 {
	var sum float64
	for _, m := range regexp.MustCompile(`(?m)^`+re+` (\S+)$`).FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
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
	e.waitReady(t)
	e.openToAll(t)
	bin := sharedBinary(t)

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
		attacker := roleCommand(bin, "sec-attacker", attackerUID, "GPUMEM_SOCKET="+e.socket, "GPUMEM_TEST_CONNS="+strconv.Itoa(perRound))
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
			return roleCommand(bin, "sec-victim", victimUID, "GPUMEM_SOCKET="+e.socket, "GPUMEM_TEST_RESERVED=1073741824")
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
	eventually(t, 5*time.Second, "every victim's new stats", func() bool {
		_, body = e.get(t, "/metrics")
		for _, v := range victims {
			re := fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, v.cmd.Process.Pid)
			if metricIn(body, re) != 2147483648 {
				return false
			}
		}
		return true
	})
	okLines := sumMetric(body, `gpumem_allocstats_messages_total\{result="ok",type="[a-z]+"\}`)
	if want := float64(3 * rounds); okLines != want {
		t.Errorf("%v messages accepted, want only the victims' %v: %v cross-user writes in %d attempts", okLines, want, okLines-want, len(stale))
	}
	if strings.Contains(body, `framework="EVIL"`) || strings.Contains(body, "8.27e+10") {
		t.Errorf("the attacker's lines reached /metrics:\n%s", grepLines(body, "EVIL", "8.27e+10"))
	}
	_, reports := e.get(t, "/api/v1/oom-reports")
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
	requireRoot(t)
	e := startExporter(t, "--allocstats.max-connections-per-uid=16", "--allocstats.max-processes-per-uid=2")
	e.waitReady(t)
	e.openToAll(t)
	bin := sharedBinary(t)
	// This process (root) opens 200 connections: 16 are kept.
	var conns []net.Conn
	for i := 0; i < 200; i++ {
		c, err := net.Dial("unix", e.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	eventually(t, 5*time.Second, "the per-uid rejections", func() bool {
		return e.metric(t, `gpumem_allocstats_connections_rejected_total\{reason="max_connections_per_uid"\}`) >= 200-16
	})
	// Four processes of nobody report: two are kept.
	var flood []*victim
	for i := 0; i < 4; i++ {
		v := startVictim(t, roleCommand(bin, "sec-victim", attackerUID, "GPUMEM_SOCKET="+e.socket, "GPUMEM_TEST_RESERVED=1000"))
		v.goAhead(t)
		flood = append(flood, v)
	}
	// Another user is served.
	good := startVictim(t, roleCommand(bin, "sec-victim", victimUID, "GPUMEM_SOCKET="+e.socket, "GPUMEM_TEST_RESERVED=4096"))
	good.goAhead(t)
	var body string
	eventually(t, 5*time.Second, "the other user's series", func() bool {
		_, body = e.get(t, "/metrics")
		return metricIn(body, fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, good.cmd.Process.Pid)) == 4096
	})
	kept := 0
	for _, v := range flood {
		if metricIn(body, fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, v.cmd.Process.Pid)) == 1000 {
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
	e := startExporter(t)
	e.waitReady(t)
	c, err := net.Dial("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := bufio.NewWriter(c)
	uuid := simulate.UUIDs[victimGPU]
	fmt.Fprintf(w, `{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":18446744073709551615,"active_bytes":18446744073709551615}]}`+"\n", uuid)
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(w, `{"v":1,"type":"oom","uuid":%q,"requested_bytes":%d}`+"\n", uuid, 1000+i)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "every oom line handled", func() bool {
		return e.metric(t, `gpumem_allocstats_messages_total\{result="ok",type="oom"\}`) == 5000
	})
	var mine []map[string]any
	eventually(t, 5*time.Second, "the one report", func() bool {
		_, body := e.get(t, "/api/v1/oom-reports")
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
	if got := e.metric(t, `gpumem_oom_reports_dropped_total\{reason="pid_rate"\}`); got < 4999 {
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
	if strings.Contains(e.log.String(), "top_holder_pid="+strconv.Itoa(os.Getpid())) {
		t.Error("the log names the unlisted process as the top holder")
	}
	total := e.metric(t, fmt.Sprintf(`gpumem_gpu_memory_total_bytes\{gpu="%d",uuid="%s"\}`, victimGPU, uuid))
	got := e.metric(t, fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*\}`, os.Getpid()))
	if total <= 0 || got != total {
		t.Errorf("claimed reserved exported as %v, want clamped to the GPU's %v", got, total)
	}
}

// TestSecurityIdleHTTPFlood: a thousand idle TCP connections do not keep
// scrapes out, and the exporter's descriptors stay bounded.
func TestSecurityIdleHTTPFlood(t *testing.T) {
	e := startExporter(t, "--web.max-connections=64")
	e.waitReady(t)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := 0; i < 1000; i++ {
		c, err := net.Dial("tcp", e.addr)
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
		resp, err := client.Get("http://" + e.addr + "/metrics")
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
		if c, err := net.Dial("tcp", e.addr); err == nil {
			idle = append(idle, c)
		}
	}
	t.Logf("slowest of 20 scrapes under %d idle connections: %s", len(idle), slowest)
	if slowest > 3*time.Second {
		t.Errorf("slowest scrape took %s, want well under the 10 s scrape timeout", slowest)
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.cmd.Process.Pid))
	if err == nil && len(ents) > 64+64 {
		t.Errorf("the exporter holds %d descriptors under the flood, want about --web.max-connections plus its own", len(ents))
	}
}

// TestSecurityLogFlood: bad lines over thousands of connections give a
// bounded number of warn lines; the rest are counted as suppressed.
func TestSecurityLogFlood(t *testing.T) {
	e := startExporter(t, "--allocstats.max-connections-per-uid=1024")
	e.waitReady(t)
	const n = 5000
	start := time.Now()
	var wg sync.WaitGroup
	var sent atomic.Int32
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/8; i++ {
				c, err := net.Dial("unix", e.socket)
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
	var handled float64
	eventually(t, 10*time.Second, "the bad lines counted", func() bool {
		handled = e.metric(t, `gpumem_allocstats_messages_total\{result="malformed",type="unknown"\}`)
		return handled >= float64(sent.Load())*0.9
	})
	elapsed := time.Since(start)
	warns := strings.Count(e.log.String(), `msg="Bad allocstats message"`)
	// A burst of 10, then one per 6 s.
	if limit := 10 + int(elapsed/(6*time.Second)) + 1; warns > limit {
		t.Errorf("%d warn lines for %v bad lines in %s, want at most %d", warns, handled, elapsed.Round(time.Millisecond), limit)
	}
	suppressed := e.metric(t, `gpumem_log_messages_suppressed_total\{path="allocstats_bad_message"\}`)
	if suppressed < handled-float64(warns) {
		t.Errorf("gpumem_log_messages_suppressed_total{path=\"allocstats_bad_message\"} = %v, want the %v lines beyond the budget", suppressed, handled-float64(warns))
	}
	t.Logf("%v bad lines over %d connections in %s: %d warn lines, %v suppressed", handled, n, elapsed.Round(time.Millisecond), warns, suppressed)
}

// TestSecuritySquattedFallbackDirectory: a daemon without root falls back
// to $XDG_RUNTIME_DIR/gpumem or $TMPDIR/gpumem-<uid>, and refuses both when
// another user made them first.
func TestSecuritySquattedFallbackDirectory(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/run/gpumem"); err == nil {
		if fi, _ := os.Stat("/run/gpumem"); fi.Mode().Perm()&0o002 != 0 {
			t.Skip("/run/gpumem is world-writable here: the daemon would not fall back")
		}
	}
	bin := sharedBinary(t)
	base := shortTempDir(t)
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
	run := func() (string, error) {
		cmd := roleCommand(bin, "exporter", victimUID, "XDG_RUNTIME_DIR="+xdg, "TMPDIR="+tmp)
		cmd.Args = append(cmd.Args, "--nvml.backend=simulated", "--web.listen-address="+freePort(t))
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			return out.String(), err
		case <-time.After(3 * time.Second): // still running: it found a socket
			cmd.Process.Signal(os.Interrupt)
			<-done
			return out.String(), nil
		}
	}
	out, err := run()
	if err == nil {
		t.Fatalf("the daemon started with both fallback directories squatted by uid %d:\n%s", attackerUID, out)
	}
	if !strings.Contains(out, "not a directory owned by uid") {
		t.Errorf("the refusal does not say why:\n%s", out)
	}
	// Once the XDG directory is the daemon's own, it is used.
	os.Chown(filepath.Join(xdg, "gpumem"), victimUID, victimUID)
	out, err = run()
	if err != nil || !strings.Contains(out, filepath.Join(xdg, "gpumem", "allocstats.sock")) {
		t.Errorf("with its own XDG directory: %v\n%s", err, out)
	}
}

// TestSecuritySocketVanishes: a deleted socket is recreated; one that
// cannot be recreated turns /-/ready red until it can.
func TestSecuritySocketVanishes(t *testing.T) {
	e := startExporter(t)
	e.waitReady(t)
	if err := os.Remove(e.socket); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the socket recreated", func() bool {
		c, err := net.Dial("unix", e.socket)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	// Something else takes the path: ready goes red, then green again.
	os.Remove(e.socket)
	if err := os.Mkdir(e.socket, 0o755); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "/-/ready red", func() bool { code, _ := e.get(t, "/-/ready"); return code == http.StatusServiceUnavailable })
	os.Remove(e.socket)
	eventually(t, 5*time.Second, "/-/ready green again", func() bool { code, _ := e.get(t, "/-/ready"); return code == 200 })
}

func TestSecurityFileLimitFitsTheConnectionCaps(t *testing.T) {
	for _, tc := range []struct {
		limit                 uint64
		conns, perUID, web    int
		health                bool
		wantConns, wantPerUID int
		wantErr               bool
	}{
		{limit: 1 << 20, conns: 1024, perUID: 64, web: 64, wantConns: 1024, wantPerUID: 64},
		// 1024 descriptors: 64 HTTP, 128 reserved, the rest for the socket at two each.
		{limit: 1024, conns: 1024, perUID: 64, web: 64, wantConns: (1024 - 64 - 128) / 2, wantPerUID: 64},
		{limit: 1024, conns: 1024, perUID: 1000, web: 64, health: true, wantConns: (1024 - 72 - 128) / 2, wantPerUID: (1024 - 72 - 128) / 2},
		{limit: 200, conns: 1024, perUID: 64, web: 64, wantErr: true},
	} {
		addrs := []string{":9481"}
		o := &options{maxConnections: tc.conns, maxConnectionsPerUID: tc.perUID, webMaxConnections: tc.web}
		o.webConfig = &web.FlagConfig{WebListenAddresses: &addrs}
		if tc.health {
			o.healthAddress = ":9482"
		}
		err := fitConnections(tc.limit, o)
		if (err != nil) != tc.wantErr {
			t.Errorf("limit %d: err = %v, want error %v", tc.limit, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && (o.maxConnections != tc.wantConns || o.maxConnectionsPerUID != tc.wantPerUID) {
			t.Errorf("limit %d: caps %d and %d per uid, want %d and %d", tc.limit, o.maxConnections, o.maxConnectionsPerUID, tc.wantConns, tc.wantPerUID)
		}
	}
}

// TestSecurityShedListenerClosesIdleConnectionsFirst: at the cap a new
// connection closes the longest-idle one; a connection serving a request
// is never closed.
func TestSecurityShedListenerClosesIdleConnectionsFirst(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newShedListener(inner, 4)
	release := make(chan struct{})
	srv := &http.Server{ConnState: connState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		io.WriteString(w, "ok")
	})}
	go srv.Serve(l)
	defer srv.Close()
	addr := inner.Addr().String()
	get := func(path string) error {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + addr + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "ok" {
			return fmt.Errorf("body %q", body)
		}
		return nil
	}
	slow := make(chan error, 1)
	go func() { slow <- get("/slow") }()
	eventually(t, 5*time.Second, "the slow request in progress", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for c := range l.conns {
			if c.busy {
				return true
			}
		}
		return false
	})
	var idle []net.Conn
	for i := 0; i < 50; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	for i := 0; i < 5; i++ {
		if err := get("/"); err != nil {
			t.Fatalf("request %d beside 50 idle connections: %v", i, err)
		}
	}
	close(release)
	if err := <-slow; err != nil {
		t.Errorf("the request in progress was cut: %v", err)
	}
	l.mu.Lock()
	open, shed := len(l.conns), l.shed
	l.mu.Unlock()
	if open > 4 || shed < 40 {
		t.Errorf("%d connections open (cap 4), %d shed", open, shed)
	}
}

// memoryRequest is the DaemonSet's memory request (deploy/kubernetes).
const memoryRequest = 96 << 20

// procStatusKiB reads a "Vm…:" line of /proc/<pid>/status, in bytes.
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
// figures).
//
// GPUMEM_ATTACK_EXPORTER=path runs the attacks against that build of the
// exporter instead of this test binary (whose own code adds to the RSS).
func TestAttackAllAtOnceStaysUnderTheMemoryRequest(t *testing.T) {
	if b := os.Getenv("GPUMEM_ATTACK_EXPORTER"); b != "" {
		defer func(old string) { binary = old }(binary)
		binary = b
	}
	e := startExporter(t, "--allocstats.max-connections-per-uid=1024", "--allocstats.max-connections=1100")
	e.waitReady(t)
	pid := e.cmd.Process.Pid
	for i := 0; i < 5; i++ {
		e.get(t, "/metrics")
	}
	baseline := procStatusBytes(t, pid, "VmRSS")

	good, err := net.Dial("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
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
			c, err := net.Dial("unix", e.socket)
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
		c, err := net.Dial("unix", e.socket)
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
			c, err := net.Dial("unix", e.socket)
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
			if c, err := net.Dial("tcp", e.addr); err == nil {
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
		re := fmt.Sprintf(`gpumem_allocator_reserved_bytes\{[^}]*pid="%d"[^}]*uuid="%s"\}`, os.Getpid(), simulate.UUIDs[2])
		seen := within(5*time.Second, func() bool {
			resp, err := client.Get("http://" + e.addr + "/metrics")
			if err != nil {
				return false
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return metricIn(string(body), re) == float64(reserved)
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
	eventually(t, 10*time.Second, "the OOM flood handled", func() bool {
		return e.metric(t, `gpumem_allocstats_messages_total\{result="ok",type="oom"\}`) == 5000
	})
	_, body := e.get(t, "/metrics")
	peak := procStatusBytes(t, pid, "VmHWM")
	rss := procStatusBytes(t, pid, "VmRSS")
	t.Logf("RSS before %.1f MiB, after %.1f MiB, peak %.1f MiB (request %d MiB, race detector %v); attacks ran %s, the good client was served %d times; connections closed for the buffer budget: %v, OOM reports dropped: %v, log lines suppressed: %v",
		float64(baseline)/(1<<20), float64(rss)/(1<<20), float64(peak)/(1<<20), memoryRequest>>20, raceEnabled, elapsed.Round(time.Millisecond), served,
		metricIn(body, `gpumem_allocstats_connections_closed_total\{reason="buffer_budget"\}`),
		sumMetric(body, `gpumem_oom_reports_dropped_total\{reason="[a-z_]+"\}`),
		sumMetric(body, `gpumem_log_messages_suppressed_total\{path="[a-z_]+"\}`))
	if !raceEnabled && peak >= memoryRequest {
		t.Errorf("peak RSS %.1f MiB under every attack at once, want under the %d MiB request", float64(peak)/(1<<20), memoryRequest>>20)
	}
}
