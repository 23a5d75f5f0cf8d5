package allocstats

import (
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// mustStats applies a stats message as the connection bound to bound.
func mustStats(t *testing.T, s *Store, bound *procEntry, id Identity, now time.Time, reports ...DeviceReport) *procEntry {
	t.Helper()
	e, err := s.stats(bound, id, reports, now, DefaultMaxDevices)
	if err != nil {
		t.Fatalf("applying stats of pid %d: %v", id.PID, err)
	}
	return e
}

// mustReport is a client that opens a session, says hello (unless
// framework is empty), sends one stats message at now and closes.
func mustReport(t *testing.T, s *Store, id Identity, framework string, now time.Time, reports ...DeviceReport) {
	t.Helper()
	session := s.Open(id, 0)
	defer session.Close(now)
	if framework != "" {
		if err := session.Hello(Hello{Framework: framework}); err != nil {
			t.Fatalf("hello of pid %d: %v", id.PID, err)
		}
	}
	if err := session.Stats(reports, now); err != nil {
		t.Fatalf("stats of pid %d: %v", id.PID, err)
	}
}

func mustProcess(t *testing.T, s *Store, pid uint32) Process {
	t.Helper()
	p, ok := s.Process(pid)
	if !ok {
		t.Fatalf("pid %d is not in the store (pids: %v)", pid, s.PIDs())
	}
	return p
}

func mustDevice(t *testing.T, p Process, uuid string) DeviceStats {
	t.Helper()
	d, ok := p.Device(uuid)
	if !ok {
		t.Fatalf("pid %d has no stats for %s (devices: %+v)", p.PID, uuid, p.Devices)
	}
	return d
}

func TestCountersNeverDecreaseWhenTheClientResetsThem(t *testing.T) {
	s := NewStore(time.Minute)
	id := Identity{PID: 100, StartTime: 7}
	var e *procEntry
	steps := []struct {
		raw  Optional
		want Optional
	}{
		{Some(5), Some(5)},
		{Some(6), Some(6)},
		{Some(0), Some(6)}, // reset_accumulated_memory_stats
		{Some(2), Some(8)},
		{Optional{}, Optional{}}, // field left out: no series, state kept
		{Some(1), Some(9)},       // another reset
		{Some(1), Some(9)},
	}
	for i, st := range steps {
		e = mustStats(t, s, e, id, t0, DeviceReport{UUID: testUUID, Reserved: 1, OOMs: st.raw, AllocRetries: st.raw})
		d := mustDevice(t, mustProcess(t, s, 100), testUUID)
		if d.OOMs != st.want || d.AllocRetries != st.want {
			t.Fatalf("step %d: client sent %+v, exported ooms %+v and alloc_retries %+v, want %+v", i, st.raw, d.OOMs, d.AllocRetries, st.want)
		}
	}
}

func TestCounterSaturatesInsteadOfWrapping(t *testing.T) {
	var c counterState
	c.update(^uint64(0))
	if got := c.update(^uint64(0) - 1); got != ^uint64(0) {
		t.Errorf("after a reset from the maximum the counter is %d, want it saturated at the maximum", got)
	}
}

func TestStatsReplaceTheDeviceStateButKeepOOMInfo(t *testing.T) {
	s := NewStore(time.Minute)
	id := Identity{PID: 1, StartTime: 1}
	e := mustStats(t, s, nil, id, t0, DeviceReport{UUID: testUUID, Reserved: 100, Active: Some(60), Limit: Some(1000)})
	if _, _, err := s.oom(e, id, OOMMessage{UUID: testUUID, RequestedBytes: 916}, t0.Add(time.Second), DefaultMaxDevices, nil); err != nil {
		t.Fatal(err)
	}
	mustStats(t, s, e, id, t0.Add(2*time.Second), DeviceReport{UUID: testUUID, Reserved: 200})
	d := mustDevice(t, mustProcess(t, s, 1), testUUID)
	want := DeviceStats{
		UUID: testUUID, HasStats: true, Reserved: 200,
		LastOOMRequest: Some(916), LastOOMTime: t0.Add(time.Second), LastReport: t0.Add(2 * time.Second), SampledAt: t0.Add(2 * time.Second),
	}
	if d != want {
		t.Errorf("device after stats, oom, stats without optional fields:\n got %+v\nwant %+v", d, want)
	}
}

func TestOOMBeforeStatsCreatesADeviceWithoutStats(t *testing.T) {
	s := NewStore(time.Minute)
	_, ev, err := s.oom(nil, Identity{PID: 3, UID: 1000, StartTime: 9}, OOMMessage{UUID: testUUID, RequestedBytes: 5, FreeBytes: Some(4)}, t0, DefaultMaxDevices, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantEv := OOMEvent{Time: t0, PID: 3, UID: 1000, StartTime: 9, UUID: testUUID, Requested: 5, Free: Some(4)}
	if ev.Stats.HasStats || ev.Stats.LastOOMRequest != Some(5) {
		t.Errorf("event's stats at the failure %+v: want no stats, the request recorded", ev.Stats)
	}
	ev.Stats = DeviceStats{}
	if !reflect.DeepEqual(ev, wantEv) {
		t.Errorf("event\n got %+v\nwant %+v", ev, wantEv)
	}
	d := mustDevice(t, mustProcess(t, s, 3), testUUID)
	if d.HasStats || d.Reserved != 0 || d.LastOOMRequest != Some(5) {
		t.Errorf("device named only by an oom message: %+v, want HasStats false and LastOOMRequest 5", d)
	}
	if got := d.Inactive(); got != 0 {
		t.Errorf("Inactive of a device without stats = %d, want 0", got)
	}
}

func TestInactiveIsReservedMinusActiveClampedAtZero(t *testing.T) {
	tests := []struct {
		d    DeviceStats
		want uint64
	}{
		{DeviceStats{HasStats: true, Reserved: 918, Active: Some(916)}, 2},
		{DeviceStats{HasStats: true, Reserved: 918}, 0}, // active unknown
		{DeviceStats{HasStats: true, Reserved: 10, Active: Some(12)}, 0},
	}
	for _, tt := range tests {
		if got := tt.d.Inactive(); got != tt.want {
			t.Errorf("reserved %d active %+v: Inactive = %d, want %d", tt.d.Reserved, tt.d.Active, got, tt.want)
		}
	}
}

func TestAReusedPIDReplacesTheEntry(t *testing.T) {
	s := NewStore(time.Minute)
	old := mustStats(t, s, nil, Identity{PID: 42, StartTime: 100}, t0, DeviceReport{UUID: testUUID, Reserved: 1, OOMs: Some(5)})
	mustStats(t, s, nil, Identity{PID: 42, StartTime: 200}, t0, DeviceReport{UUID: testUUID2, Reserved: 2, OOMs: Some(1)})
	p := mustProcess(t, s, 42)
	if p.StartTime != 200 || len(p.Devices) != 1 || p.Devices[0].UUID != testUUID2 || p.Devices[0].OOMs != Some(1) {
		t.Errorf("after pid reuse the process is %+v, want only the new process's device with ooms 1", p)
	}
	if _, err := s.stats(old, Identity{PID: 42, StartTime: 100}, []DeviceReport{{UUID: testUUID, Reserved: 9}}, t0, DefaultMaxDevices); err != errProcessGone {
		t.Errorf("a message on the replaced process's connection: err = %v, want errProcessGone", err)
	}
}

func TestASecondConnectionOfTheSameProcessSharesItsEntry(t *testing.T) {
	s := NewStore(time.Minute)
	a := mustStats(t, s, nil, Identity{PID: 7, StartTime: 1}, t0, DeviceReport{UUID: testUUID, Reserved: 1, OOMs: Some(3)})
	b := mustStats(t, s, nil, Identity{PID: 7, StartTime: 1}, t0, DeviceReport{UUID: testUUID2, Reserved: 2})
	if a != b {
		t.Fatal("two connections of one process got different entries")
	}
	s.release(a, t0)
	if p := mustProcess(t, s, 7); !p.Connected || len(p.Devices) != 2 {
		t.Errorf("one of two connections closed: %+v, want connected with both devices", p)
	}
	s.release(b, t0)
	if p := mustProcess(t, s, 7); p.Connected {
		t.Errorf("both connections closed, but the process is still connected")
	}
}

func TestPruneDropsDeadAndExpiredProcessesOnly(t *testing.T) {
	s := NewStore(time.Minute)
	live := mustStats(t, s, nil, Identity{PID: 1, StartTime: 1}, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	dead := mustStats(t, s, nil, Identity{PID: 2, StartTime: 2}, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	gone := mustStats(t, s, nil, Identity{PID: 3, StartTime: 3}, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	mustReport(t, s, Identity{PID: 4, StartTime: 4}, "pytorch", t0, DeviceReport{UUID: testUUID, Reserved: 1})
	_ = live
	_ = dead
	s.release(gone, t0)

	alive := func(pid uint32, start uint64) bool { return pid != 2 }
	s.Prune(t0.Add(59*time.Second), alive)
	if got := s.PIDs(); !equalPIDs(got, []uint32{1, 3, 4}) {
		t.Errorf("after Prune within the TTL pids are %v, want [1 3 4] (2 is dead)", got)
	}
	mustReport(t, s, Identity{PID: 4, StartTime: 4}, "pytorch", t0.Add(30*time.Second), DeviceReport{UUID: testUUID, Reserved: 1})
	s.Prune(t0.Add(time.Minute), alive)
	if got := s.PIDs(); !equalPIDs(got, []uint32{1, 4}) {
		t.Errorf("after Prune at the TTL pids are %v, want [1 4] (3 disconnected a TTL ago; 4 reported again since)", got)
	}
	// 2 exited with its connection open: hidden, dropped when it closes.
	s.release(dead, t0)
	if _, err := s.stats(dead, Identity{PID: 2, StartTime: 2}, []DeviceReport{{UUID: testUUID, Reserved: 1}}, t0, DefaultMaxDevices); err != errProcessGone {
		t.Errorf("a pruned process's closed connection could still write: err = %v", err)
	}
	exitProcess(s, 4)
	if got := s.PIDs(); !equalPIDs(got, []uint32{1}) {
		t.Errorf("after pid 4 exited pids are %v, want [1]", got)
	}
	if n := s.nDevices.Load(); n != 1 {
		t.Errorf("device count after pruning is %d, want 1", n)
	}
}

func TestReconnectWithinTTLKeepsCounters(t *testing.T) {
	s := NewStore(time.Minute)
	id := Identity{PID: 5, StartTime: 5}
	e := mustStats(t, s, nil, id, t0, DeviceReport{UUID: testUUID, Reserved: 1, OOMs: Some(4)})
	s.release(e, t0)
	// The client restarts its counters on reconnect: still no decrease.
	mustStats(t, s, nil, id, t0.Add(time.Second), DeviceReport{UUID: testUUID, Reserved: 1, OOMs: Some(1)})
	if d := mustDevice(t, mustProcess(t, s, 5), testUUID); d.OOMs != Some(5) {
		t.Errorf("ooms after a reconnect = %+v, want 5", d.OOMs)
	}
}

func TestDevicesPerProcessAreCapped(t *testing.T) {
	s := NewStore(time.Minute)
	id := Identity{PID: 9, StartTime: 9}
	e := mustStats(t, s, nil, id, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	if _, err := s.stats(e, id, []DeviceReport{{UUID: testUUID, Reserved: 2}, {UUID: testUUID2, Reserved: 2}}, t0, 1); err == nil {
		t.Error("a second device was accepted with a cap of 1")
	}
	if d := mustDevice(t, mustProcess(t, s, 9), testUUID); d.Reserved != 1 {
		t.Errorf("a rejected message changed the store: reserved %d, want 1", d.Reserved)
	}
	if _, err := s.stats(e, id, []DeviceReport{{UUID: testUUID, Reserved: 3}}, t0, 1); err != nil {
		t.Errorf("updating the one device under a cap of 1: %v", err)
	}
	if _, _, err := s.oom(e, id, OOMMessage{UUID: testUUID2, RequestedBytes: 1}, t0, 1, nil); err == nil {
		t.Error("an oom for a second device was accepted with a cap of 1")
	}
}

func TestProcessesIsADeepCopySortedByPIDAndUUID(t *testing.T) {
	s := NewStore(time.Minute)
	for _, pid := range []uint32{30, 10, 20} {
		mustStats(t, s, nil, Identity{PID: pid, StartTime: 1}, t0,
			DeviceReport{UUID: testUUID2, Reserved: uint64(pid)}, DeviceReport{UUID: testUUID, Reserved: uint64(pid)})
	}
	ps := s.Processes()
	if len(ps) != 3 || ps[0].PID != 10 || ps[1].PID != 20 || ps[2].PID != 30 {
		t.Fatalf("Processes not sorted by pid: %+v", ps)
	}
	for _, p := range ps {
		if len(p.Devices) != 2 || p.Devices[0].UUID != testUUID || p.Devices[1].UUID != testUUID2 {
			t.Errorf("pid %d devices not sorted by UUID: %+v", p.PID, p.Devices)
		}
	}
	ps[0].Devices[0].Reserved = 999
	_ = append(ps[0].Devices, DeviceStats{UUID: "x"})
	if d := mustDevice(t, mustProcess(t, s, 10), testUUID); d.Reserved != 10 {
		t.Errorf("changing the copy changed the store: reserved %d", d.Reserved)
	}
	if d := s.Processes()[1].Devices[0]; d.Reserved != 20 {
		t.Errorf("appending to one process's devices overwrote the next: %+v", d)
	}
}

// A session applies its client's messages to the client's process, which
// stays while the session is open and for the TTL after it closes; a
// session of a new holder of the pid replaces the old holder's entry.
func TestASessionKeepsItsProcessWhileOpenThenForTheTTL(t *testing.T) {
	s := NewStore(time.Minute)
	id := Identity{PID: 50, UID: 1000, StartTime: 9}
	session := s.Open(id, 1)
	if err := session.Hello(Hello{Framework: "pytorch\n", Client: "gpumem/1"}); err != nil {
		t.Fatal(err)
	}
	if err := session.Stats([]DeviceReport{{UUID: testUUID, Reserved: 10, OOMs: Some(2)}}, t0); err != nil {
		t.Fatal(err)
	}
	if err := session.Stats([]DeviceReport{{UUID: testUUID2, Reserved: 1}}, t0); err == nil {
		t.Error("a second device was accepted by a session opened for one")
	}
	ev, err := session.OOM(OOMMessage{UUID: testUUID, RequestedBytes: 916}, t0.Add(time.Second), nil)
	if err != nil || ev.PID != 50 || ev.UID != 1000 || ev.UUID != testUUID || ev.Requested != 916 || ev.StartTime != 9 || ev.Stats.Reserved != 10 {
		t.Errorf("OOM = %+v, %v; want an event for pid 50 on %s, with its stats", ev, err, testUUID)
	}
	p := mustProcess(t, s, 50)
	d := mustDevice(t, p, testUUID)
	if p.Framework != "pytorch?" || p.Client != "gpumem/1" || p.UID != 1000 || p.StartTime != 9 || !p.Connected ||
		len(p.Devices) != 1 || d.Reserved != 10 || d.OOMs != Some(2) || d.LastOOMRequest != Some(916) {
		t.Errorf("process of the session %+v device %+v", p, d)
	}
	alive := func(uint32, uint64) bool { return true }
	s.Prune(t0.Add(time.Hour), alive)
	mustProcess(t, s, 50)
	session.Close(t0.Add(time.Hour))
	session.Close(t0.Add(2 * time.Hour)) // a second Close changes nothing
	if p := mustProcess(t, s, 50); p.Connected {
		t.Error("the process is connected after its only session closed")
	}
	if err := session.Stats([]DeviceReport{{UUID: testUUID, Reserved: 1}}, t0); err == nil {
		t.Error("a closed session took a message")
	}
	s.Prune(t0.Add(time.Hour+59*time.Second), alive)
	mustProcess(t, s, 50)
	s.Prune(t0.Add(time.Hour+time.Minute), alive)
	if _, ok := s.Process(50); ok {
		t.Error("a process outlived the TTL after its session closed")
	}

	// A session of another process with the same pid replaces the entry.
	old := s.Open(id, 0)
	if err := old.Stats([]DeviceReport{{UUID: testUUID, Reserved: 10}}, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Open(Identity{PID: 50, UID: 1000, StartTime: 10}, 0).Stats([]DeviceReport{{UUID: testUUID2, Reserved: 1}}, t0); err != nil {
		t.Fatal(err)
	}
	p = mustProcess(t, s, 50)
	if p.StartTime != 10 || len(p.Devices) != 1 || p.Devices[0].UUID != testUUID2 {
		t.Errorf("after stats from a new holder of the pid: %+v", p)
	}
	if err := old.Stats([]DeviceReport{{UUID: testUUID, Reserved: 1}}, t0); err != errProcessGone {
		t.Errorf("the old holder's session took a message after its entry was replaced: err = %v", err)
	}
}

func equalPIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A process that exits right after writing: Prune finds it gone while its
// connection still holds queued lines. The lines are still applied, to an
// entry no reader sees, and the entry goes when the connection closes; a
// new process with the same pid never sees or changes it.
func TestAnExitedProcessKeepsItsQueuedLinesUntilItsConnectionCloses(t *testing.T) {
	s := NewStore(time.Minute)
	s.SetProcessLimits(1, 1)
	var events []OOMEvent
	s.OnOOM(observeOOM(func(ev OOMEvent) { events = append(events, ev) }))
	old := Identity{PID: 42, UID: 1000, StartTime: 100}
	e := mustStats(t, s, nil, old, t0, DeviceReport{UUID: testUUID, Reserved: 1, OOMs: Some(1)})

	s.Prune(t0, func(pid uint32, start uint64) bool { return false })
	if _, ok := s.Process(42); ok || len(s.Processes()) != 0 || len(s.PIDs()) != 0 {
		t.Fatalf("an exited process is still exported: %v", s.PIDs())
	}
	if n := s.nDevices.Load(); n != 0 {
		t.Errorf("device count after the exit = %d, want 0", n)
	}
	// Its queued lines are still taken: the last stats and the oom.
	if _, err := s.stats(e, old, []DeviceReport{{UUID: testUUID, Reserved: 2, OOMs: Some(2)}}, t0, DefaultMaxDevices); err != nil {
		t.Errorf("a line queued before the exit was refused: %v", err)
	}
	if _, ev, err := s.oom(e, old, OOMMessage{UUID: testUUID, RequestedBytes: 916}, t0, DefaultMaxDevices, nil); err != nil || ev.PID != 42 || ev.StartTime != 100 {
		t.Errorf("an oom queued before the exit: %+v, %v", ev, err)
	}
	if len(events) != 1 {
		t.Errorf("%d OOM events recorded, want 1", len(events))
	}

	// The pid is reused (the exited one's slot is free: the limit is 1).
	// The new process gets its own entry, and the old connection's lines
	// never reach it.
	reused := Identity{PID: 42, UID: 1000, StartTime: 200}
	n := mustStats(t, s, nil, reused, t0, DeviceReport{UUID: testUUID2, Reserved: 7})
	if n == e {
		t.Fatal("the new holder of the pid got the exited process's entry")
	}
	if _, err := s.stats(e, old, []DeviceReport{{UUID: testUUID, Reserved: 3}}, t0, DefaultMaxDevices); err != nil {
		t.Errorf("the exited process's connection, after the pid was reused: %v", err)
	}
	p := mustProcess(t, s, 42)
	if p.StartTime != 200 || len(p.Devices) != 1 || p.Devices[0].UUID != testUUID2 || p.Devices[0].Reserved != 7 {
		t.Errorf("the new holder of the pid is %+v, want only its own device", p)
	}

	// EOF: the last connection closes and the exited entry is gone.
	s.release(e, t0)
	if _, err := s.stats(e, old, []DeviceReport{{UUID: testUUID, Reserved: 4}}, t0, DefaultMaxDevices); err != errProcessGone {
		t.Errorf("the exited entry took a message after its connection closed: err = %v", err)
	}
	if p := mustProcess(t, s, 42); p.StartTime != 200 || p.Devices[0].Reserved != 7 {
		t.Errorf("closing the exited process's connection changed the new holder: %+v", p)
	}
	if n := s.nDevices.Load(); n != 1 {
		t.Errorf("device count = %d, want 1", n)
	}
}

// Readers and a connection's later messages never take the store-wide
// lock: with it held (as while a new process is admitted or Prune drops
// one), Processes, Process, PIDs, DropUnlisted and a bound connection's
// stats, hello and oom all complete.
func TestReadersAndBoundWritersDoNotWaitOnTheStoreLock(t *testing.T) {
	s := NewStore(time.Minute)
	id := Identity{PID: 8, UID: 1000, StartTime: 1}
	e := mustStats(t, s, nil, id, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	s.mu.Lock()
	done := make(chan string, 8)
	go func() {
		defer close(done)
		if ps := s.Processes(); len(ps) != 1 {
			done <- "Processes"
		}
		if _, ok := s.Process(8); !ok {
			done <- "Process"
		}
		if len(s.PIDs()) != 1 {
			done <- "PIDs"
		}
		s.DropUnlisted(t0, time.Minute, func(uint32, string) bool { return true })
		if _, err := s.stats(e, id, []DeviceReport{{UUID: testUUID, Reserved: 2}}, t0, DefaultMaxDevices); err != nil {
			done <- "stats: " + err.Error()
		}
		if _, err := s.hello(e, id, wire.Hello{Framework: "jax"}); err != nil {
			done <- "hello: " + err.Error()
		}
		if _, _, err := s.oom(e, id, OOMMessage{UUID: testUUID, RequestedBytes: 1}, t0, DefaultMaxDevices, nil); err != nil {
			done <- "oom: " + err.Error()
		}
	}()
	select {
	case what, ok := <-done:
		if ok {
			t.Errorf("%s failed", what)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a reader or a bound connection's message waited on the store's lock (10s)")
	}
	s.mu.Unlock()
	if p := mustProcess(t, s, 8); p.Framework != "jax" || mustDevice(t, p, testUUID).Reserved != 2 {
		t.Errorf("after the messages: %+v", p)
	}
}

// Version moves with every change Processes would show, and only then:
// the OOM reports skip their per-poll join while it stands still.
func TestVersionMovesWithWhatProcessesReturns(t *testing.T) {
	s := NewStore(time.Minute)
	s.SetLinger(time.Minute)
	last := s.Version()
	step := func(what string, changes bool, f func()) {
		t.Helper()
		before := s.Processes()
		f()
		v := s.Version()
		if moved := v != last; moved != changes {
			t.Errorf("%s: version %d -> %d; want moved=%v (Processes before %+v, after %+v)", what, last, v, changes, before, s.Processes())
		}
		last = v
	}
	var e *procEntry
	id := Identity{PID: 1, StartTime: 1}
	step("first stats line", true, func() { e = mustStats(t, s, nil, id, t0, DeviceReport{UUID: testUUID, Reserved: 1}) })
	step("stats line of a bound connection", true, func() { mustStats(t, s, e, id, t0, DeviceReport{UUID: testUUID, Reserved: 2}) })
	step("hello", true, func() {
		if _, err := s.hello(e, id, wire.Hello{Framework: "pytorch"}); err != nil {
			t.Fatal(err)
		}
	})
	step("oom line", true, func() {
		if _, _, err := s.oom(e, id, OOMMessage{UUID: testUUID, RequestedBytes: 1}, t0, DefaultMaxDevices, nil); err != nil {
			t.Fatal(err)
		}
	})
	step("reads", false, func() { s.Processes(); s.PIDs(); s.Process(1) })
	step("a prune that keeps everything", false, func() { s.Prune(t0.Add(time.Second), func(uint32, uint64) bool { return true }) })
	step("a device still listed", false, func() {
		s.DropUnlisted(t0, time.Minute, func(uint32, string) bool { return true })
	})
	step("a device unlisted within the grace", false, func() {
		s.DropUnlisted(t0, time.Minute, func(uint32, string) bool { return false })
	})
	step("a device unlisted for the grace", true, func() {
		s.DropUnlisted(t0.Add(time.Minute), time.Minute, func(uint32, string) bool { return false })
	})
	var session *Session
	step("a session opens", false, func() { session = s.Open(Identity{PID: 2, StartTime: 2}, 0) })
	step("its first stats", true, func() {
		if err := session.Stats([]DeviceReport{{UUID: testUUID, Reserved: 1}}, t0); err != nil {
			t.Fatal(err)
		}
	})
	step("it closes", false, func() { session.Close(t0) })
	step("a process exits", true, func() { s.Prune(t0.Add(2*time.Second), func(pid uint32, _ uint64) bool { return pid != 2 }) })
	step("its linger passes", true, func() { s.Prune(t0.Add(2*time.Minute), func(pid uint32, _ uint64) bool { return pid != 2 }) })
}

// exitProcess tells s that process pid exited, as the poller's Prune does
// when /proc no longer has it.
func exitProcess(s *Store, pid uint32) {
	s.Prune(time.Now(), func(p uint32, _ uint64) bool { return p != pid })
}
