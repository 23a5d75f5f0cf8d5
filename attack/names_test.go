package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
	"github.com/gpumem/gpumem_exporter/simulate"
)

// hostileName is what a process names itself (prctl PR_SET_NAME, or a
// write to /proc/self/comm) to reach a terminal that shows a label, a
// report or a Kubernetes Event: an xterm title, a bell, a screen clear.
const hostileName = "\x1b]0;PWN\a\x1b[2J"

func init() { roles["sec-named"] = runNamed }

// runNamed names itself hostileName, reports stats and an OOM, prints
// "ready" once the verdict came, and exits when stdin closes.
func runNamed() int {
	if err := os.WriteFile("/proc/self/comm", []byte(hostileName), 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	conn, err := net.Dial("unix", os.Getenv("GPUMEM_SOCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	uuid := simulate.UUIDs[victimGPU]
	fmt.Fprintf(conn, `{"v":1,"type":"hello","framework":"pytorch"}`+"\n")
	fmt.Fprintf(conn, `{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":1073741824,"active_bytes":1073741824}]}`+"\n", uuid)
	fmt.Fprintf(conn, `{"v":1,"type":"oom","uuid":%q,"requested_bytes":1073741824}`+"\n", uuid)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			fmt.Fprintln(os.Stderr, "no verdict:", err)
			return 1
		}
		if strings.Contains(line, `"verdict"`) {
			break
		}
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestSecurityControlCharactersInAProcessName: a process named with
// terminal escapes, a bell and bidi controls shows in /metrics, on the
// landing page and in the OOM reports with each control replaced, never
// as the raw bytes.
func TestSecurityControlCharactersInAProcessName(t *testing.T) {
	e := startExporter(t)
	e.WaitReady(t)
	cmd := exportertest.RoleCommand(os.Args[0], "sec-named", "GPUMEM_SOCKET="+e.Socket)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); waitQuietly(cmd) })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the named process did not report: %q", line)
	}
	pid := fmt.Sprint(cmd.Process.Pid)
	want := "\uFFFD]0;PWN\uFFFD\uFFFD[2J"
	exportertest.Eventually(t, 10*time.Second, "the named process in /metrics", func() bool {
		return strings.Contains(e.Scrape(t), `pid="`+pid+`"`)
	})
	for _, path := range []string{"/metrics", "/", "/api/v1/oom-reports"} {
		_, body := e.Get(t, path)
		if i := strings.IndexAny(body, "\x1b\a"); i >= 0 {
			t.Errorf("%s carries a raw control byte of the process name: %q", path, body[max(0, i-40):min(len(body), i+40)])
		}
	}
	if body := e.Scrape(t); !strings.Contains(body, `comm="`+want+`"`) {
		t.Errorf("/metrics has no comm=%q for pid %s:\n%s", want, pid, exportertest.GrepLines(body, `pid="`+pid+`"`))
	}
}

func waitQuietly(cmd *exec.Cmd) { _ = cmd.Wait() }
