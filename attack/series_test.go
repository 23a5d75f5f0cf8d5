package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/gpumem/gpumem_exporter/simulate"
)

func init() { roles["sec-reporter"] = runReporter }

// runReporter reports every field on every simulated GPU and one OOM,
// prints "ready" and holds its connection until stdin closes.
func runReporter() int {
	conn, err := net.Dial("unix", os.Getenv("GPUMEM_SOCKET"))
	if err != nil {
		fmt.Println("failed:", err)
		return 0
	}
	defer conn.Close()
	var devs []string
	for _, u := range simulate.UUIDs {
		devs = append(devs, fmt.Sprintf(`{"uuid":%q,"reserved_bytes":2147483648,"active_bytes":1073741824,"allocated_bytes":1073741824,"inactive_split_bytes":1048576,"peak_reserved_bytes":3221225472,"peak_active_bytes":2147483648,"limit_bytes":42949672960,"alloc_retries":1,"ooms":1}`, u))
	}
	fmt.Fprintf(conn, `{"v":1,"type":"hello","framework":"pytorch"}`+"\n")
	fmt.Fprintf(conn, `{"v":1,"type":"stats","devices":[%s]}`+"\n", strings.Join(devs, ","))
	fmt.Fprintf(conn, `{"v":1,"type":"oom","uuid":%q,"requested_bytes":1073741824}`+"\n", simulate.UUIDs[0])
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestSecuritySeriesPerUID: one uid runs more reporting processes than its
// cap, each reporting every field on all 8 GPUs of the simulated node and
// an OOM. At most 64 of them are exported, with at most 20 series per
// process and GPU (docs/security.md has the measured figure).
func TestSecuritySeriesPerUID(t *testing.T) {
	requireRoot(t)
	const procs, perUIDCap, gpus, maxPerProcessGPU = 70, 64, 8, 20
	e := startExporter(t)
	e.WaitReady(t)
	openToAll(t, e)
	bin := sharedTestBinary(t)
	pids := map[string]bool{}
	for range procs {
		cmd := roleCommand(bin, "sec-reporter", victimUID, "GPUMEM_SOCKET="+e.Socket)
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.Close(); cmd.Wait() })
		bufio.NewReader(out).ReadString('\n')
		pids[fmt.Sprint(cmd.Process.Pid)] = true
	}
	// Every process's stats and OOM are in once a scrape shows them.
	var series int
	exported := map[string]bool{}
	pidLabel := regexp.MustCompile(`pid="(\d+)"`)
	for range 50 {
		series, exported = 0, map[string]bool{}
		for line := range strings.SplitSeq(e.Scrape(t), "\n") {
			if m := pidLabel.FindStringSubmatch(line); m != nil && pids[m[1]] && !strings.HasPrefix(line, "#") {
				series++
				exported[m[1]] = true
			}
		}
		if len(exported) >= perUIDCap {
			break
		}
	}
	t.Logf("%d reporting processes of uid %d on %d GPUs: %d exported, %d series (%.0f a process)",
		procs, victimUID, gpus, len(exported), series, float64(series)/float64(max(1, len(exported))))
	if len(exported) > perUIDCap {
		t.Errorf("%d processes of one uid exported, want at most the cap of %d", len(exported), perUIDCap)
	}
	if series > perUIDCap*gpus*maxPerProcessGPU {
		t.Errorf("%d series for one uid, want at most %d × %d × %d", series, perUIDCap, gpus, maxPerProcessGPU)
	}
}
