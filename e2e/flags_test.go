package e2e

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// Every bad flag value gives one line naming the flag, exit status 2, and
// leaves nothing behind: no socket, no directory.
func TestBadFlagValuesNameTheFlagAndLeaveNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		arg, flag string
	}{
		{"--web.telemetry-path=metrics", "--web.telemetry-path"},
		{"--web.telemetry-path=/", "--web.telemetry-path"},
		{"--web.telemetry-path=/-/healthy", "--web.telemetry-path"},
		{"--nvml.poll-interval=abc", "nvml.poll-interval"},
		{"--nvml.poll-interval=0s", "--nvml.poll-interval"},
		{"--nvml.process-refresh=-1s", "--nvml.process-refresh"},
		{"--nvml.process-refresh=often", "nvml.process-refresh"},
		{"--allocstats.socket-mode=rw", "allocstats.socket-mode"},
		{"--allocstats.socket-mode=1777", "allocstats.socket-mode"},
		{"--allocstats.max-connections=0", "--allocstats.max-connections"},
		{"--allocstats.oom-reports=-1", "--allocstats.oom-reports"},
		{"--allocstats.ttl=-1s", "--allocstats.ttl"},
		{"--allocstats.idle-timeout=0s", "--allocstats.idle-timeout"},
		{"--allocstats.max-message-bytes=10", "--allocstats.max-message-bytes"},
		{"--nvml.simulated.processes-per-gpu=100", "--nvml.simulated.processes-per-gpu"},
		{"--web.max-connections=0", "--web.max-connections"},
		{"--nvml.backend=cuda", "nvml.backend"},
		{"--log.level=verbose", "--log.level"},
		{"--nvml.simulated.scenario=leaky", "--nvml.simulated.scenario"},
		{"--web.config.file=/nonexistent/web.yml", "--web.config.file=/nonexistent/web.yml"},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			t.Parallel()
			dir := exportertest.ShortTempDir(t)
			socket := filepath.Join(dir, "sub", "a.sock")
			cmd := exporterCommand(t)("--nvml.backend=simulated", "--web.listen-address=127.0.0.1:0", "--allocstats.socket="+socket, tc.arg)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("%s: err = %v, want exit status 2; output:\n%s", tc.arg, err, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.flag) {
				t.Errorf("%s: output %q, want one line naming %s", tc.arg, out, tc.flag)
			}
			if _, err := os.Stat(filepath.Dir(socket)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: the socket's directory was created (stat: %v)", tc.arg, err)
			}
		})
	}
}

// A listen address in use is found before the socket or NVML is touched.
func TestPortInUseFailsBeforeTheSocketIsCreated(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, addr := range []string{busy.Addr().String(), ":notaport"} {
		dir := exportertest.ShortTempDir(t)
		socket := filepath.Join(dir, "a.sock")
		out, err := exporterCommand(t)("--nvml.backend=simulated", "--web.listen-address="+addr, "--allocstats.socket="+socket).CombinedOutput()
		if err == nil {
			t.Fatalf("--web.listen-address=%s: the exporter ran; output:\n%s", addr, out)
		}
		if !strings.Contains(string(out), "--web.listen-address="+addr) {
			t.Errorf("--web.listen-address=%s: error does not name the flag:\n%s", addr, out)
		}
		if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("--web.listen-address=%s: the socket was left behind (stat: %v)", addr, err)
		}
		if strings.Contains(string(out), "simulated NVML backend") {
			t.Errorf("--web.listen-address=%s: the backend started before the address was checked:\n%s", addr, out)
		}
	}
}
