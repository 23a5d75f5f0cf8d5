package attack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func init() { roles["sec-holder"] = runHolder }

// runHolder opens GPUMEM_TEST_CONNS connections, says hello on each,
// prints how many were welcomed and holds them until stdin closes.
func runHolder() int {
	n, _ := strconv.Atoi(os.Getenv("GPUMEM_TEST_CONNS"))
	welcomed := 0
	var conns []net.Conn
	for range n {
		c, err := net.Dial("unix", os.Getenv("GPUMEM_SOCKET"))
		if err != nil {
			continue
		}
		conns = append(conns, c)
		io.WriteString(c, `{"v":1,"type":"hello","framework":"pytorch"}`+"\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err == nil && strings.Contains(line, "welcome") {
			welcomed++
		}
	}
	fmt.Println(welcomed)
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	return 0
}

// TestSecuritySlotsSpreadOverManyUIDs: root (or root in a pod that mounts
// the socket) takes every connection slot by spreading its processes over
// 17 uids, 64 connections each, under the per-uid cap. A client of a uid
// that holds no connection is still served.
func TestSecuritySlotsSpreadOverManyUIDs(t *testing.T) {
	requireRoot(t)
	const (
		uids    = 17
		perUID  = 64
		firstID = 20000
	)
	e := startExporter(t)
	e.WaitReady(t)
	openToAll(t, e)
	bin := sharedTestBinary(t)
	held := 0
	for i := range uids {
		cmd := roleCommand(bin, "sec-holder", firstID+i, "GPUMEM_SOCKET="+e.Socket, "GPUMEM_TEST_CONNS="+strconv.Itoa(perUID))
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.Close(); cmd.Wait() })
		line, _ := bufio.NewReader(out).ReadString('\n')
		n, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("holder of uid %d: %q", firstID+i, line)
		}
		held += n
	}
	open := e.Metric(t, `gpumem_allocstats_connections`)
	t.Logf("%d uids x %d connections: %d welcomed, %v open", uids, perUID, held, open)
	if open < 1000 {
		t.Fatalf("the attack took only %v of the 1024 slots; the test does not test the cap", open)
	}
	v := startVictim(t, roleCommand(bin, "sec-victim", victimUID, "GPUMEM_SOCKET="+e.Socket, "GPUMEM_TEST_RESERVED=1073741824"))
	fmt.Fprintln(v.in, "go")
	select {
	case got := <-v.reply:
		if got != "ready" {
			t.Fatalf("the client of uid %d, which held no connection, was not served with every slot taken (it said %q)", victimUID, got)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the client of uid %d did not report within 15 s", victimUID)
	}
	// 16 uids fill the 1024 slots; the 17th and the client's uid each
	// took the place of one connection of a uid that held 64.
	closed := e.Metric(t, `gpumem_allocstats_connections_closed_total\{reason="max_connections"\}`)
	if closed != 2 {
		t.Errorf("connections closed to make room: %v, want 2 (for the 17th uid and for the client)", closed)
	}
}
