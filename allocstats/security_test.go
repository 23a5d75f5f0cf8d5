package allocstats

import (
	"errors"
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-kit/log"
	"golang.org/x/sys/unix"
)

// Tests of the attacks in docs/security.md, inside the package: identity,
// bounded memory and the socket file. The end-to-end versions, with real
// processes of other users, are in attack/ (attack/security_test.go).

// sleeper starts a child process that waits until the test ends, and
// returns it with a pidfd of it.
func sleeper(t *testing.T) (*exec.Cmd, *pidfd) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v (kernel before 5.3?)", err)
	}
	return cmd, &pidfd{fd: fd}
}

func TestIdentifyPeer(t *testing.T) {
	me := uint32(os.Getuid())
	type setup struct {
		kp       kernelPeerInfo
		proc     procInfo
		procErr  error
		accepted time.Duration
	}
	tests := []struct {
		name string
		// prepare returns the kernel's view and what /proc says; it may
		// kill the peer.
		prepare func(t *testing.T) setup
		wantErr error // nil: identified
	}{
		{"a live peer with a pidfd is identified", func(t *testing.T) setup {
			cmd, fd := sleeper(t)
			return setup{kp: kernelPeerInfo{pid: uint32(cmd.Process.Pid), uid: me, pidfd: fd}, proc: procInfo{startTime: 5, euid: me}}
		}, nil},
		{"a peer that exited before /proc was read is refused, whatever /proc says about its pid now", func(t *testing.T) setup {
			cmd, fd := sleeper(t)
			cmd.Process.Kill()
			cmd.Wait()
			// /proc answers for a new holder of the pid: a reuse.
			return setup{kp: kernelPeerInfo{pid: uint32(cmd.Process.Pid), uid: me, pidfd: fd}, proc: procInfo{startTime: 99, euid: me}}
		}, errPeerGone},
		{"without a pidfd, a pid that /proc shows under another uid is refused", func(t *testing.T) setup {
			return setup{kp: kernelPeerInfo{pid: 4242, uid: 65534}, proc: procInfo{startTime: 5, euid: 1000}}
		}, errPeerGone},
		{"with a pidfd, the peer is proven: a uid changed since it connected is no reason to refuse", func(t *testing.T) setup {
			cmd, fd := sleeper(t)
			return setup{kp: kernelPeerInfo{pid: uint32(cmd.Process.Pid), uid: me, pidfd: fd}, proc: procInfo{startTime: 5, euid: 1000}}
		}, nil},
		{"without a pidfd, a pid gone from /proc is refused", func(t *testing.T) setup {
			return setup{kp: kernelPeerInfo{pid: 4242, uid: me}, procErr: fs.ErrNotExist}
		}, errPeerGone},
		{"without a pidfd, a process started after the accept is refused", func(t *testing.T) setup {
			return setup{kp: kernelPeerInfo{pid: 4242, uid: me}, proc: procInfo{startTime: 1000 * clockTicksPerSecond, euid: me}, accepted: 10 * time.Second}
		}, errPeerGone},
		{"without a pidfd, a process started before the accept is identified", func(t *testing.T) setup {
			return setup{kp: kernelPeerInfo{pid: 4242, uid: me}, proc: procInfo{startTime: 5 * clockTicksPerSecond, euid: me}, accepted: 10 * time.Second}
		}, nil},
		{"an unreadable /proc leaves the start time unknown: refused", func(t *testing.T) setup {
			return setup{kp: kernelPeerInfo{pid: 4242, uid: me}, procErr: errors.New("permission denied")}
		}, errPeerCredentials},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.prepare(t)
			readProc := func(uint32) (procInfo, error) { return st.proc, st.procErr }
			p, err := identify(st.kp, readProc, st.accepted)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("identifyPeer: %v, want the peer identified", err)
				}
				defer p.close()
				if p.id != (Identity{PID: st.kp.pid, UID: st.kp.uid, StartTime: st.proc.startTime}) || !p.isAlive() {
					t.Errorf("peer = %+v alive %v, want pid %d start %d, alive", p.id, p.isAlive(), st.kp.pid, st.proc.startTime)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("identifyPeer = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestPeerCredentialsGiveAPidfdOfTheConnectingProcess(t *testing.T) {
	a, b, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	kp, err := peerCredentials(a)
	if err != nil {
		t.Fatal(err)
	}
	if kp.pid != uint32(os.Getpid()) || kp.uid != uint32(os.Geteuid()) {
		t.Errorf("peer = pid %d uid %d, want this process", kp.pid, kp.uid)
	}
	if kp.pidfd == nil {
		t.Skip("this kernel has no SO_PEERPIDFD")
	}
	defer kp.pidfd.close()
	if !kp.pidfd.alive() {
		t.Error("the pidfd of this very process says it is dead")
	}
}

func socketPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, _ := net.FileConn(f)
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1]), nil
}

// fakePeers makes the server see each connection as the next of peers.
func fakePeers(peers ...*peer) func(*Server) {
	var next atomic.Int32
	return func(s *Server) {
		s.identify = func(kernelConn, time.Duration) (*peer, error) {
			return peers[int(next.Add(1)-1)%len(peers)], nil
		}
	}
}

func TestServerClosesTheConnectionOfAnExitedProcessAndDropsItsMessages(t *testing.T) {
	var dead atomic.Bool
	p := &peer{id: Identity{PID: 5000, UID: 65534, StartTime: 7}, alive: func() bool { return !dead.Load() }, sweep: true}
	ts := startServer(t, nil, fakePeers(p))
	c := dial(t, ts.path)
	c.send(statsLine(testUUID, 1, ""))
	c.hello()
	dead.Store(true)
	// The periodic check closes it, and a line sent meanwhile is dropped.
	c.c.Write([]byte(statsLine(testUUID, 82700000000, "") + "\n"))
	c.expectClosed(5 * time.Second)
	if d := mustDevice(t, mustProcess(t, ts.store, 5000), testUUID); d.Reserved != 1 {
		t.Errorf("a line written after the process exited was applied: reserved %d", d.Reserved)
	}
	eventually(t, "the close is counted", func() bool {
		return counterValue(t, ts.srv.connectionsClosed.WithLabelValues(closeProcessGone)) == 1
	})
}

// A process writes its last lines and exits before the daemon reads them
// (here: the reader is held inside the liveness check of the first of
// them while the process exits, closes its end and is pruned). Every line
// it wrote is still applied, none counted rejected, and its entry goes at
// EOF. No sleep races a timer: the test holds the reader at a gate.
func TestServerAppliesTheLinesAnExitedProcessQueued(t *testing.T) {
	const pid = 5002
	var armed, held atomic.Bool
	var dead atomic.Bool
	reached, gate := make(chan struct{}), make(chan struct{})
	p := &peer{id: Identity{PID: pid, UID: 1000, StartTime: 7}, alive: func() bool {
		if armed.Load() && !held.Swap(true) {
			close(reached)
			<-gate
		}
		return !dead.Load()
	}}
	var ooms atomic.Int32
	ts := startServer(t, nil, fakePeers(p), func(s *Server) {
		s.store.OnOOM(observeOOM(func(OOMEvent) { ooms.Add(1) }))
	})
	c := dial(t, ts.path)
	c.send(statsLine(testUUID, 1, ""))
	c.hello() // the connection is bound to the process
	armed.Store(true)
	c.send(statsLine(testUUID, 2, ""))
	<-reached // the reader holds the line of reserved 2
	c.send(statsLine(testUUID, 3, `,"ooms":1`),
		`{"v":1,"type":"oom","uuid":"`+testUUID+`","requested_bytes":916}`)
	c.c.Close() // the process exits
	dead.Store(true)
	ts.store.Prune(time.Now(), func(uint32, uint64) bool { return false })
	if _, ok := ts.store.Process(pid); ok {
		t.Error("an exited process is still exported")
	}
	ts.srv.closeStale() // must leave the connection to drain
	close(gate)

	eventually(t, "the connection is closed", func() bool { return gaugeValue(t, ts.srv.connections) == 0 })
	if got := ts.messages(t, wire.TypeStats, wire.ResultOK); got != 3 {
		t.Errorf("stats accepted = %v, want 3", got)
	}
	if got := ts.messages(t, wire.TypeOOM, wire.ResultOK); got != 1 || ooms.Load() != 1 {
		t.Errorf("oom accepted = %v, OOM events %d; want 1 and 1", got, ooms.Load())
	}
	if got := ts.messages(t, wire.TypeStats, wire.ResultRejected) + ts.messages(t, wire.TypeOOM, wire.ResultRejected); got != 0 {
		t.Errorf("%v lines counted rejected", got)
	}
	if got := counterValue(t, ts.srv.connectionsClosed.WithLabelValues(closeProcessGone)); got != 0 {
		t.Errorf("the daemon closed the connection (process_gone %v) before it was drained", got)
	}
	if e := ts.srv.store; len(e.PIDs()) != 0 {
		t.Errorf("pids after the drain: %v", e.PIDs())
	}
}

// The process's liveness is asked once per read of the socket, after it:
// alive then, it was alive when every line of that read was written. Ten
// lines written at once (one read) cost one check.
func TestLivenessIsCheckedOncePerRead(t *testing.T) {
	var calls atomic.Int32
	p := &peer{id: Identity{PID: 5003, UID: 1000, StartTime: 7}, alive: func() bool { calls.Add(1); return true }}
	ts := startServer(t, nil, fakePeers(p))
	c := dial(t, ts.path)
	c.hello()
	before := calls.Load()
	var batch strings.Builder
	for i := 0; i < 10; i++ {
		batch.WriteString(statsLine(testUUID, uint64(i), "") + "\n")
	}
	c.write(batch.String())
	eventually(t, "the ten lines are applied", func() bool { return ts.messages(t, wire.TypeStats, wire.ResultOK) == 10 })
	if n := calls.Load() - before; n != 1 {
		t.Errorf("liveness asked %d times for one read of ten lines, want 1", n)
	}
}

func TestAnEntryOfALiveProcessIsNeverReplacedByAnotherIdentity(t *testing.T) {
	s := NewStore(time.Minute)
	victim := Identity{PID: 77, UID: 1000, StartTime: 500}
	mustStats(t, s, nil, victim, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	// The same process under another uid (a connection that was not the
	// victim's): refused, the entry stays.
	if _, err := s.stats(nil, Identity{PID: 77, UID: 65534, StartTime: 500}, []DeviceReport{{UUID: testUUID, Reserved: 82700000000}}, t0, DefaultMaxDevices); !errors.Is(err, errIdentityConflict) {
		t.Errorf("another uid with the victim's pid and start time: err = %v, want errIdentityConflict", err)
	}
	if _, err := s.hello(nil, Identity{PID: 77, UID: 65534, StartTime: 500}, wire.Hello{Framework: "EVIL"}); !errors.Is(err, errIdentityConflict) {
		t.Errorf("hello from another uid: err = %v, want errIdentityConflict", err)
	}
	p := mustProcess(t, s, 77)
	if p.UID != 1000 || p.Framework != "" || mustDevice(t, p, testUUID).Reserved != 1 {
		t.Errorf("the victim's entry changed: %+v", p)
	}
}

func TestServerClosesTheConnectionsOfARemovedEntry(t *testing.T) {
	p := &peer{id: Identity{PID: 5001, UID: 1000, StartTime: 7}}
	ts := startServer(t, nil, fakePeers(p))
	c := dial(t, ts.path)
	c.send(statsLine(testUUID, 1, ""))
	c.hello()
	exitProcess(ts.store, 5001)
	c.expectClosed(5 * time.Second) // closed without sending anything: it reconnects
}

func TestProcessLimits(t *testing.T) {
	s := NewStore(time.Minute)
	s.SetProcessLimits(3, 2)
	for i, tc := range []struct {
		id   Identity
		want error
	}{
		{Identity{PID: 1, UID: 1, StartTime: 1}, nil},
		{Identity{PID: 2, UID: 1, StartTime: 1}, nil},
		{Identity{PID: 3, UID: 1, StartTime: 1}, errTooManyProcessesForUID},
		{Identity{PID: 3, UID: 2, StartTime: 1}, nil},
		{Identity{PID: 4, UID: 3, StartTime: 1}, errTooManyProcesses},
		// A new process in a dead one's pid takes its place, not a slot.
		{Identity{PID: 2, UID: 1, StartTime: 2}, nil},
	} {
		_, err := s.stats(nil, tc.id, []DeviceReport{{UUID: testUUID, Reserved: 1}}, t0, DefaultMaxDevices)
		if !errors.Is(err, tc.want) {
			t.Errorf("step %d, %+v: err = %v, want %v", i, tc.id, err, tc.want)
		}
	}
	// Every session counts, whatever its source (the simulated node's too).
	if err := s.Open(Identity{PID: 100, UID: 3, StartTime: 1}, 0).Stats([]DeviceReport{{UUID: testUUID, Reserved: 1}}, t0); !errors.Is(err, errTooManyProcesses) {
		t.Errorf("a session over the limit: err = %v, want %v", err, errTooManyProcesses)
	}
	exitProcess(s, 1)
	if _, err := s.stats(nil, Identity{PID: 5, UID: 3, StartTime: 1}, []DeviceReport{{UUID: testUUID, Reserved: 1}}, t0, DefaultMaxDevices); err != nil {
		t.Errorf("a slot freed by an exit was not reusable: %v", err)
	}
}

func TestServerCapsConnectionsPerUID(t *testing.T) {
	var next atomic.Uint32
	ts := startServer(t, func(c *Config) { c.MaxConnectionsPerUID = 2 }, func(s *Server) {
		s.identify = func(kernelConn, time.Duration) (*peer, error) {
			n := next.Add(1)
			uid := uint32(65534)
			if n == 4 {
				uid = 1000 // the fourth connection is another user's
			}
			return &peer{id: Identity{PID: 6000 + n, UID: uid, StartTime: 1}}, nil
		}
	})
	// One at a time, so that the server identifies them in this order.
	dial(t, ts.path).hello()
	dial(t, ts.path).hello()
	dial(t, ts.path).expectClosed(5 * time.Second)
	dial(t, ts.path).hello() // another uid is served
	if got := counterValue(t, ts.srv.connectionsRejected.WithLabelValues(rejectMaxConnectionsPerUID)); got != 1 {
		t.Errorf("rejected for the per-uid cap = %v, want 1", got)
	}
}

func TestIdleTimeoutCountsOnlyAcceptedMessages(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	c := dial(t, ts.path)
	c.hello()
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // blank lines, garbage and a trickle of an unfinished line
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := c.c.Write([]byte([]string{"\n", "garbage\n", "{"}[i%3])); err != nil {
				return
			}
		}
	}()
	c.expectClosed(5 * time.Second)
	close(stop)
	wg.Wait()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("closed after %s: blank and bad lines kept the connection open", d)
	}
	eventually(t, "the idle close is counted", func() bool {
		return counterValue(t, ts.srv.connectionsClosed.WithLabelValues(closeIdle)) == 1
	})
}

// The read deadline lags behind the idle timeout by up to a second (it is
// moved lazily); a connection that keeps sending accepted messages is
// never closed for it, and an idle one still is.
func TestALazyDeadlineNeverClosesAnActiveConnection(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.IdleTimeout = 400 * time.Millisecond })
	c := dial(t, ts.path)
	c.hello()
	for i := 0; i < 30; i++ { // 1.5s of messages, 50ms apart
		time.Sleep(50 * time.Millisecond)
		c.send(statsLine(testUUID, uint64(i), ""))
	}
	// Every message was taken: the connection stayed open throughout.
	eventually(t, "the 30 messages are applied", func() bool { return ts.messages(t, wire.TypeStats, wire.ResultOK) == 30 })
	if got := counterValue(t, ts.srv.connectionsClosed.WithLabelValues(closeIdle)); got != 0 {
		t.Fatalf("an active connection was closed as idle (%v)", got)
	}
	c.expectClosed(5 * time.Second)
	eventually(t, "the idle close is counted", func() bool {
		return counterValue(t, ts.srv.connectionsClosed.WithLabelValues(closeIdle)) == 1
	})
}

func TestByteCountsAreClampedToTheDevicesMemory(t *testing.T) {
	events := make(chan OOMEvent, 1)
	ts := startServer(t, nil, func(s *Server) { s.store.OnOOM(observeOOM(func(ev OOMEvent) { events <- ev })) })
	c := dial(t, ts.path)
	const huge = "18446744073709551615"
	c.send(fmt.Sprintf(`{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%s,"active_bytes":%s,"peak_reserved_bytes":%s,"limit_bytes":%s,"alloc_retries":%s}]}`,
		testUUID, huge, huge, huge, huge, huge))
	c.send(fmt.Sprintf(`{"v":1,"type":"oom","uuid":%q,"requested_bytes":%s,"free_bytes":%s,"limit_bytes":%s}`, testUUID, huge, huge, huge))
	c.hello()
	d := mustDevice(t, mustProcess(t, ts.store, uint32(os.Getpid())), testUUID)
	if d.Reserved != testTotalBytes || d.Active.V != testTotalBytes || d.PeakReserved.V != testTotalBytes || d.Limit.V != testTotalBytes {
		t.Errorf("byte counts not clamped to %d: %+v", uint64(testTotalBytes), d)
	}
	if d.AllocRetries.V != 1<<64-1 {
		t.Errorf("a counter (not bytes) was clamped: %+v", d.AllocRetries)
	}
	ev := <-events
	if ev.Free.V != testTotalBytes || ev.Limit.V != testTotalBytes || ev.Requested != 1<<64-1 {
		t.Errorf("oom event %+v: want free and limit clamped, the request as sent", ev)
	}
}

func TestDropUnlistedKeepsStateForTheGraceOnly(t *testing.T) {
	s := NewStore(time.Hour)
	listedHere := map[string]bool{testUUID: true}
	listed := func(pid uint32, uuid string) bool { return pid != 1 || listedHere[uuid] }
	mustStats(t, s, nil, Identity{PID: 1, UID: 1, StartTime: 1}, t0,
		DeviceReport{UUID: testUUID, Reserved: 1}, DeviceReport{UUID: testUUID2, Reserved: 2})
	mustStats(t, s, nil, Identity{PID: 2, UID: 1, StartTime: 1}, t0, DeviceReport{UUID: testUUID2, Reserved: 1})
	s.DropUnlisted(t0, 30*time.Second, listed)
	s.DropUnlisted(t0.Add(29*time.Second), 30*time.Second, listed)
	if p := mustProcess(t, s, 1); len(p.Devices) != 2 {
		t.Fatalf("dropped within the grace: %+v", p.Devices)
	}
	s.DropUnlisted(t0.Add(30*time.Second), 30*time.Second, listed)
	p := mustProcess(t, s, 1)
	if len(p.Devices) != 1 || p.Devices[0].UUID != testUUID {
		t.Errorf("after the grace devices = %+v, want only the listed %s", p.Devices, testUUID)
	}
	if len(mustProcess(t, s, 2).Devices) != 1 {
		t.Error("a listed process's device was dropped")
	}
	if s.nDevices.Load() != 2 {
		t.Errorf("device count = %d, want 2", s.nDevices.Load())
	}
	// Listed again before the grace ends: the clock restarts.
	listedHere[testUUID] = false
	s.DropUnlisted(t0.Add(40*time.Second), 30*time.Second, listed)
	listedHere[testUUID] = true
	s.DropUnlisted(t0.Add(60*time.Second), 30*time.Second, listed)
	listedHere[testUUID] = false
	s.DropUnlisted(t0.Add(80*time.Second), 30*time.Second, listed)
	if len(mustProcess(t, s, 1).Devices) != 1 {
		t.Error("a device listed in between was dropped on the old clock")
	}
}

func TestBufferBudgetClosesTheBiggestHolder(t *testing.T) {
	const budget = 64 << 10
	ts := startServer(t, func(c *Config) { c.MaxBufferedBytes, c.MaxMessageBytes = budget, budget })
	// A hog with 48 KiB of one unfinished line.
	hog := dial(t, ts.path)
	hog.write(`{"v":1,"type":"hello","pad":"` + strings.Repeat("x", 48<<10))
	eventually(t, "the hog's bytes are held", func() bool { used, _ := ts.srv.budget.stats(); return used >= 48<<10 })
	// Small ones with 4 KiB each do not fit beside it: the hog goes.
	var smalls []*client
	for i := 0; i < 8; i++ {
		c := dial(t, ts.path)
		c.write(`{"v":1,"type":"hello","pad":"` + strings.Repeat("y", 4<<10))
		smalls = append(smalls, c)
	}
	hog.expectClosed(5 * time.Second)
	for _, c := range smalls {
		c.send(`"}`)
		if line, err := c.readLine(); err != nil || !strings.Contains(line, "welcome") {
			t.Errorf("a small client was not served: %q, %v", line, err)
		}
	}
	if used, _ := ts.srv.budget.stats(); used > budget {
		t.Errorf("held %d bytes, over the budget of %d", used, budget)
	}
	eventually(t, "the budget close is counted", func() bool {
		return counterValue(t, ts.srv.connectionsClosed.WithLabelValues(closeBufferBudget)) == 1
	})
	eventually(t, "everything is returned", func() bool { used, _ := ts.srv.budget.stats(); return used == 0 })
}

func TestIdleConnectionsHoldNoLineBuffer(t *testing.T) {
	ts := startServer(t, nil)
	for i := 0; i < 20; i++ {
		c := dial(t, ts.path)
		c.send(statsLine(testUUID, 1, "")+"\n"+strings.Repeat(" ", 3000), `{"v":1,"type":"hello"}`)
		if _, err := c.readLine(); err != nil {
			t.Fatal(err)
		}
	}
	if used, _ := ts.srv.budget.stats(); used != 0 {
		t.Errorf("idle connections hold %d bytes of line buffers, want 0", used)
	}
}

func TestVanishedSocketIsRecreated(t *testing.T) {
	ts := startServer(t, nil)
	if !ts.srv.SocketReady() {
		t.Fatal("not ready after Listen")
	}
	if err := os.Remove(ts.path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the socket is recreated", func() bool {
		_, err := os.Lstat(ts.path)
		return err == nil && ts.srv.SocketReady()
	})
	dial(t, ts.path).hello()
}

func TestReplacedSocketMakesTheServerUnready(t *testing.T) {
	ts := startServer(t, nil)
	os.Remove(ts.path)
	// Another daemon takes the path before the check.
	other, err := net.ListenUnix("unix", &net.UnixAddr{Name: ts.path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	other.SetUnlinkOnClose(false)
	defer other.Close()
	eventually(t, "the server reports its socket missing", func() bool { return !ts.srv.SocketReady() })
	// Shutdown must not unlink the other daemon's socket.
	ts.srv.Close()
	if _, err := os.Lstat(ts.path); err != nil {
		t.Errorf("the server removed another daemon's socket on shutdown: %v", err)
	}
}

func TestShutdownUnlinksOnlyItsOwnSocket(t *testing.T) {
	dir := shortTempDir(t)
	path := filepath.Join(dir, "s.sock")
	srv, err := NewServer(Config{SocketPath: path, SocketExplicit: true}, NewStore(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	// A second daemon removed our file and made its own.
	os.Remove(path)
	other, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	other.SetUnlinkOnClose(false)
	defer other.Close()
	srv.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("shutdown unlinked the other daemon's socket: %v", err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Errorf("the other daemon's socket no longer answers: %v", err)
	} else {
		c.Close()
	}
}

// TestLogFloodIsRateLimitedNodeWide: many connections each sending one bad
// line give a bounded number of warn lines, the rest at debug.
func TestLogFloodIsRateLimitedNodeWide(t *testing.T) {
	var buf syncBuffer
	logger := logfmt(&buf)
	ts := startServerWithLogger(t, logger)
	for i := 0; i < 200; i++ {
		c := dial(t, ts.path)
		c.send("garbage")
		c.c.Close()
	}
	eventually(t, "every bad line is counted", func() bool { return ts.messages(t, wire.TypeUnknown, wire.ResultMalformed) == 200 })
	if n := strings.Count(buf.String(), "level=warn"); n > 20 {
		t.Errorf("%d warn lines for 200 bad lines over 200 connections, want at most the burst", n)
	}
	if n := ts.srv.warnMessage.Suppressed(); n < 180 {
		t.Errorf("suppressed = %d, want the lines beyond the burst counted", n)
	}
}

// write sends s as it is, without a newline.
func (c *client) write(s string) {
	c.t.Helper()
	if _, err := c.c.Write([]byte(s)); err != nil {
		c.t.Fatalf("writing %.80q: %v", s, err)
	}
}

func startServerWithLogger(t *testing.T, logger log.Logger) *testServer {
	return startServer(t, func(c *Config) { c.MaxConnectionsPerUID = 1000 }, func(s *Server) { s.logger = logger })
}

func logfmt(w io.Writer) log.Logger { return log.NewLogfmtLogger(w) }

// syncBuffer collects log output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// While the poller prunes the store, a connection bound to a live entry
// is left to the prune (no pidfd check of its own every second); one not
// bound yet, or any connection when the store was not pruned lately, is
// still asked through its pidfd.
func TestServerLeavesBoundConnectionsToThePrune(t *testing.T) {
	var calls atomic.Int32
	p := &peer{id: Identity{PID: 5003, UID: 1000, StartTime: 7}, alive: func() bool { calls.Add(1); return true }, sweep: true}
	srv, err := NewServer(Config{}, NewStore(time.Minute), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Two connections of p, tracked as the accept loop does (no Serve: no
	// periodic check runs meanwhile): one bound to its entry by a stats
	// line, one that never sent anything.
	entry, err := srv.store.stats(nil, p.id, []DeviceReport{{UUID: testUUID, Reserved: 1}}, time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, bound := range []bool{true, false} {
		a, b, err := socketPair()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close(); b.Close() })
		cs := &connState{c: a, peer: p}
		if bound {
			cs.entry.Store(entry)
		}
		srv.conns[cs] = struct{}{}
	}
	alive := func(uint32, uint64) bool { return true }

	srv.store.Prune(time.Now(), alive)
	before := calls.Load()
	srv.closeStale()
	if got := calls.Load() - before; got != 1 {
		t.Errorf("right after a prune: %d pidfd checks, want 1 (the unbound connection only)", got)
	}

	srv.store.Prune(time.Now().Add(-3*checkInterval), alive) // the last prune, three checks ago
	before = calls.Load()
	srv.closeStale()
	if got := calls.Load() - before; got != 2 {
		t.Errorf("without a recent prune: %d pidfd checks, want 2", got)
	}
}
