package exportertest

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records failures instead of failing, and
// runs its cleanups when asked.
type recorder struct {
	testing.TB
	errors   []string
	cleanups []func()
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Failed() bool        { return len(r.errors) > 0 }
func (r *recorder) Cleanup(f func())    { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Errorf(format string, a ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, a...))
}

func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// fakeExporter is a shell that logs the exporter-toolkit's listening line
// and exits with onInterrupt at SIGINT, or with early at once when early is
// not empty.
func fakeExporter(onInterrupt int, early string) Command {
	return func(args ...string) *exec.Cmd {
		script := fmt.Sprintf(`trap 'kill $!; exit %d' INT; echo 'level=info msg="Listening on" address=127.0.0.1:9'; %s sleep 60 >/dev/null 2>&1 & wait`, onInterrupt, early)
		return exec.Command("sh", "-c", script)
	}
}

// A test fails when its exporter does not exit with status 0 at SIGINT
// (66: the race detector found a race), or exits before the test ends.
func TestStartFailsTheTestOnABadExit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command Command
		want    string // in the failure; empty: no failure
	}{
		{"clean exit", fakeExporter(0, ""), ""},
		{"race report", fakeExporter(66, ""), "race detector found a race"},
		{"other status", fakeExporter(3, ""), "exit status 3"},
		{"died during the test", fakeExporter(0, "exit 0;"), "exited during the test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			e := Start(r, tc.command)
			if e.Addr != "127.0.0.1:9" {
				t.Errorf("address %q, want the one the log names", e.Addr)
			}
			if tc.name == "died during the test" {
				Eventually(t, 5*time.Second, "the fake exporter's exit", e.Exited)
			}
			r.end()
			got := strings.Join(r.errors, "\n")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("failures %q, want one with %q", got, tc.want)
			}
		})
	}
}

func TestChildEnvKeepsGORACEOptionsAndStopsTheExitSleep(t *testing.T) {
	t.Setenv("GORACE", "halt_on_error=1")
	var gorace []string
	for _, kv := range ChildEnv("A=1") {
		if strings.HasPrefix(kv, "GORACE=") {
			gorace = append(gorace, kv)
		}
	}
	if len(gorace) != 1 || gorace[0] != "GORACE=halt_on_error=1 atexit_sleep_ms=0" {
		t.Errorf("GORACE entries %q, want one with both options", gorace)
	}
}

func TestRoleCommandReexecutesTheBinaryInItsRole(t *testing.T) {
	cmd := RoleCommand("/bin/test-binary", "client", "GPUMEM_SOCKET=/s")
	if cmd.Path != "/bin/test-binary" || len(cmd.Args) != 1 {
		t.Errorf("command %s %q, want the binary without arguments", cmd.Path, cmd.Args)
	}
	env := strings.Join(cmd.Env, "\n")
	for _, want := range []string{RoleEnv + "=client", "GPUMEM_SOCKET=/s", "atexit_sleep_ms=0"} {
		if !strings.Contains(env, want) {
			t.Errorf("environment lacks %q", want)
		}
	}
}

func TestFreeAddrIsALoopbackPortNoOneListensOn(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	l.Close()
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("address %s, want one on 127.0.0.1", addr)
	}
}
