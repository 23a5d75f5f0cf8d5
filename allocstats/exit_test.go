package allocstats

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"github.com/gpumem/gpumem_exporter/internal/defaults"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// exitWriterEnv names the socket the helper process writes to.
const exitWriterEnv = "GPUMEM_TEST_EXIT_WRITER_SOCKET"

// exitWriterLines is how many stats lines the helper writes before it
// exits.
const exitWriterLines = 50

// TestHelperExitWriter is not a test: run by
// TestLinesWrittenRightBeforeExitAreAllApplied as a child process, it
// connects, waits for the welcome, writes its lines and an oom at once and
// exits without closing anything.
func TestHelperExitWriter(t *testing.T) {
	path := os.Getenv(exitWriterEnv)
	if path == "" {
		t.Skip("a helper process, run by TestLinesWrittenRightBeforeExitAreAllApplied")
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		os.Exit(2)
	}
	fmt.Fprintf(c, "{\"v\":1,\"type\":\"hello\",\"framework\":\"pytorch\"}\n")
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		os.Exit(3)
	}
	var lines []byte
	for i := range exitWriterLines {
		lines = append(lines, pythonStatsLine(testUUID, uint64(i))+"\n"...)
	}
	lines = append(lines, `{"v":1,"type":"oom","uuid":"`+testUUID+`","requested_bytes":916}`+"\n"...)
	if _, err := c.Write(lines); err != nil {
		os.Exit(4)
	}
	os.Exit(0)
}

// Real processes, identified by the kernel, write their last lines and
// exit at once, while the poller prunes every millisecond: every line is
// applied, whether the daemon reads it before or after the exit.
func TestLinesWrittenRightBeforeExitAreAllApplied(t *testing.T) {
	const children = 20
	ts := startServer(t, func(c *Config) {
		c.MaxConnectionsPerUID, c.MaxConnections = 2*children, 2*children
	})
	stop := make(chan struct{})
	var pruning sync.WaitGroup
	pruning.Add(1)
	go func() {
		defer pruning.Done()
		alive := func(pid uint32, start uint64) bool {
			info, err := readProcInfo(defaults.ProcPath, pid)
			if errors.Is(err, fs.ErrNotExist) {
				return false
			}
			return err != nil || info.startTime == start
		}
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				ts.store.Prune(time.Now(), alive)
			}
		}
	}()
	defer func() { close(stop); pruning.Wait() }()

	var wg sync.WaitGroup
	errs := make(chan error, children)
	for i := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperExitWriter$")
			cmd.Env = append(os.Environ(), exitWriterEnv+"="+ts.path)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("child %d: %v: %s", i, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	eventually(t, "every connection is closed", func() bool { return gaugeValue(t, ts.srv.connections) == 0 })
	want := strconv.Itoa(children * exitWriterLines)
	if got := strconv.Itoa(int(ts.messages(t, wire.TypeStats, wire.ResultOK))); got != want {
		t.Errorf("stats applied: %s, want %s", got, want)
	}
	if got := ts.messages(t, wire.TypeOOM, wire.ResultOK); got != children {
		t.Errorf("oom applied: %v, want %d", got, children)
	}
	if got := ts.messages(t, wire.TypeStats, wire.ResultRejected) + ts.messages(t, wire.TypeOOM, wire.ResultRejected); got != 0 {
		t.Errorf("%v lines rejected", got)
	}
	eventually(t, "the poller prunes every exited process", func() bool { return len(ts.store.PIDs()) == 0 })
}
