package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/simulate"
)

func init() { roles["linger-short"] = runShortReporter }

// runShortReporter is one process of the series flood: hello, the stats
// of one GPU with an OOM counted, an oom line, then it exits about a
// second later.
func runShortReporter() int {
	conn, err := net.Dial("unix", os.Getenv("GPUMEM_SOCKET"))
	if err != nil {
		return 1
	}
	defer conn.Close()
	uuid := simulate.UUIDs[victimGPU]
	fmt.Fprintf(conn, `{"v":1,"type":"hello","framework":"pytorch","client":"flood/1"}`+"\n"+
		`{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":1048576,"active_bytes":0,"alloc_retries":1,"ooms":1}]}`+"\n"+
		`{"v":1,"type":"oom","uuid":%q,"requested_bytes":1048576}`+"\n", uuid, uuid)
	conn.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, bufio.NewReader(conn))
	return 0
}

// allocatorSeries counts the per-process series of the allocator and
// process_info in a scrape.
func allocatorSeries(body string) int {
	n := 0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "gpumem_allocator_") || strings.HasPrefix(line, "gpumem_process_info{") {
			n++
		}
	}
	return n
}

// TestSecurityLingerSeriesFlood: one uid keeps 60 short reporting
// processes running at a time (each reports, raises an OOM and exits
// after about a second). Processes that exited count against the uid's
// process cap, and those NVML never listed (the simulated node lists no
// real process) leave no row: the flood's series stay within the cap's
// figure of docs/security.md (64 processes of about 17 series), and the
// exporter's RSS under the DaemonSet's memory request.
func TestSecurityLingerSeriesFlood(t *testing.T) {
	requireRoot(t)
	_, race := exporterBinary(t)
	e := startExporter(t, "--allocstats.oom-linger=1m")
	e.WaitReady(t)
	openToAll(t, e)
	bin := sharedTestBinary(t)
	baseline := allocatorSeries(e.Scrape(t))

	const concurrent, duration = 60, 20 * time.Second
	var started atomic.Int64
	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for i := 0; i < concurrent; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				cmd := roleCommand(bin, "linger-short", victimUID, "GPUMEM_SOCKET="+e.Socket)
				cmd.Stdout, cmd.Stderr = nil, nil
				if err := cmd.Run(); err != nil {
					if _, ok := err.(*exec.ExitError); !ok {
						t.Error(err)
						return
					}
				}
				started.Add(1)
			}
		}()
	}
	peak := 0
	for time.Now().Before(stop.Add(3 * time.Second)) {
		peak = max(peak, allocatorSeries(e.Scrape(t))-baseline)
		time.Sleep(500 * time.Millisecond)
	}
	wg.Wait()
	const perUID = 64 * 17
	hwm := procStatusBytes(t, e.Pid(), "VmHWM")
	t.Logf("%d short processes of uid %d; peak %d series over the %d of the simulated node; peak RSS %d MiB (race %v)",
		started.Load(), victimUID, peak, baseline, hwm>>20, race)
	if peak > perUID {
		t.Errorf("the flood of one uid held %d series, over the cap's %d", peak, perUID)
	}
	if !race && hwm > memoryRequest {
		t.Errorf("peak RSS %d MiB, over the memory request of %d MiB", hwm>>20, memoryRequest>>20)
	}
}
