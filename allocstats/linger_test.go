package allocstats

import (
	"testing"
	"time"
)

// lingerStore is a store with a linger of a minute and small caps: 8
// processes in all, 4 per uid.
func lingerStore() *Store {
	s := NewStore(time.Hour)
	s.SetLinger(time.Minute)
	s.SetProcessLimits(8, 4)
	return s
}

// countRows returns the processes Processes lists per uid, live and
// exited.
func countRows(s *Store) (live, exited map[uint32]int) {
	live, exited = map[uint32]int{}, map[uint32]int{}
	for _, p := range s.Processes() {
		if p.Exited {
			exited[p.UID]++
		} else {
			live[p.UID]++
		}
	}
	return live, exited
}

// shortProcess reports once (with an OOM) as id and exits: Prune finds it
// gone.
func shortProcess(t *testing.T, s *Store, id Identity, now time.Time) error {
	t.Helper()
	e, err := s.stats(nil, id, []DeviceReport{{UUID: testUUID, Reserved: 1, OOMs: Some(1)}}, now, DefaultMaxDevices)
	if err != nil {
		return err
	}
	s.release(e, now)
	s.Prune(now, func(pid uint32, start uint64) bool { return pid != id.PID || start != id.StartTime })
	return nil
}

// One uid running short processes keeps at most its cap of rows, live and
// lingering together; the flood pushes out only its own lingering rows.
func TestLingeringProcessesCountAgainstTheirUIDsCap(t *testing.T) {
	s := lingerStore()
	const flooder = 1000
	for i := uint32(1); i <= 500; i++ {
		now := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		if err := shortProcess(t, s, Identity{PID: 1000 + i, UID: flooder, StartTime: uint64(i)}, now); err != nil {
			t.Fatalf("short process %d of the flooding uid refused: %v (its own lingering rows must make room)", i, err)
		}
		live, exited := countRows(s)
		if n := live[flooder] + exited[flooder]; n > 4 {
			t.Fatalf("after %d short processes the uid has %d rows (%d live, %d exited), want at most its cap of 4", i, n, live[flooder], exited[flooder])
		}
	}
	if _, exited := countRows(s); exited[flooder] != 4 {
		t.Errorf("the flooding uid's lingering rows = %d, want its cap of 4 (the latest ones)", exited[flooder])
	}
	// A live process over the cap is refused when no lingering row of its
	// own uid is left to push out.
	for i := uint32(1); i <= 4; i++ {
		mustStats(t, s, nil, Identity{PID: 5000 + i, UID: flooder, StartTime: 1}, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	}
	if _, err := s.stats(nil, Identity{PID: 5005, UID: flooder, StartTime: 1}, []DeviceReport{{UUID: testUUID, Reserved: 1}}, t0, DefaultMaxDevices); err == nil {
		t.Error("a fifth live process of the uid was admitted over the cap of 4")
	}
	if _, exited := countRows(s); exited[flooder] != 0 {
		t.Errorf("lingering rows of the uid with 4 live processes = %d, want 0 (pushed out by its own new processes)", exited[flooder])
	}
}

// Another uid's lingering row stays for the whole linger, whatever one uid
// does, even with the global cap reached.
func TestNoUIDPushesOutAnotherUIDsLingeringRows(t *testing.T) {
	s := lingerStore()
	const victim, attacker = 65534, 1000
	victimID := Identity{PID: 42, UID: victim, StartTime: 7}
	if err := shortProcess(t, s, victimID, t0); err != nil {
		t.Fatal(err)
	}
	// Fill the global cap with other uids' live processes, then flood.
	for u := uint32(1); u <= 7; u++ {
		if u == 4 {
			continue
		}
		mustStats(t, s, nil, Identity{PID: 100 + u, UID: 2000 + u, StartTime: 1}, t0, DeviceReport{UUID: testUUID, Reserved: 1})
	}
	refused := 0
	for i := uint32(1); i <= 2000; i++ {
		now := t0.Add(time.Duration(i) * 25 * time.Millisecond) // 50 s in all, within the linger
		if err := shortProcess(t, s, Identity{PID: 10000 + i, UID: attacker, StartTime: uint64(i)}, now); err != nil {
			refused++
		}
		if i%100 != 0 {
			continue
		}
		found := false
		for _, p := range s.Processes() {
			if p.PID == victimID.PID && p.Exited {
				found = p.UID == victim && p.StartTime == victimID.StartTime && mustDevice(t, p, testUUID).OOMs == Some(1)
			}
		}
		if !found {
			t.Fatalf("after %d short processes of uid %d (%d refused), uid %d's lingering row is gone or changed", i, attacker, refused, victim)
		}
	}
	s.Prune(t0.Add(time.Minute), nil)
	for _, p := range s.Processes() {
		if p.PID == victimID.PID {
			t.Errorf("the lingering row outlived the linger: %+v", p)
		}
	}
}

// A process that takes the pid of one that exited (before Prune noticed)
// does not erase it: the earlier process lingers under its own identity,
// with its own uid and counters.
func TestADeadEarlierHolderOfThePidLingersUnderItsOwnIdentity(t *testing.T) {
	s := lingerStore()
	victim := Identity{PID: 77, UID: 65534, StartTime: 100}
	e := mustStats(t, s, nil, victim, t0, DeviceReport{UUID: testUUID, Reserved: 1, OOMs: Some(3)})
	s.release(e, t0)
	reuser := Identity{PID: 77, UID: 1000, StartTime: 200}
	mustStats(t, s, nil, reuser, t0.Add(time.Second), DeviceReport{UUID: testUUID, Reserved: 2, OOMs: Some(0)})

	var got []Process
	for _, p := range s.Processes() {
		if p.PID == 77 {
			got = append(got, p)
		}
	}
	if len(got) != 2 {
		t.Fatalf("processes of pid 77 = %+v, want the new one and the lingering earlier one", got)
	}
	for _, p := range got {
		want := reuser
		if p.Exited {
			want = victim
		}
		ooms := mustDevice(t, p, testUUID).OOMs
		switch {
		case p.UID != want.UID || p.StartTime != want.StartTime:
			t.Errorf("process of pid 77 (exited %v) is uid %d start %d, want uid %d start %d", p.Exited, p.UID, p.StartTime, want.UID, want.StartTime)
		case p.Exited && ooms != Some(3):
			t.Errorf("the lingering earlier holder's OOMs = %+v, want 3", ooms)
		case !p.Exited && ooms != Some(0):
			t.Errorf("the new holder's OOMs = %+v, want its own 0", ooms)
		}
	}
}

// Once the linger has passed, a uid's lingering rows no longer count
// against its cap.
func TestLingeringRowsLeaveTheCapWithTheLinger(t *testing.T) {
	s := lingerStore()
	s.SetProcessLimits(8, 2)
	for i := uint32(1); i <= 2; i++ {
		if err := shortProcess(t, s, Identity{PID: i, UID: 1000, StartTime: 1}, t0); err != nil {
			t.Fatal(err)
		}
	}
	s.Prune(t0.Add(time.Minute), nil)
	if s.nGone != 0 || len(s.gonePerUID) != 0 {
		t.Fatalf("after the linger: %d lingering counted, per uid %v; want none", s.nGone, s.gonePerUID)
	}
	for i := uint32(3); i <= 4; i++ {
		mustStats(t, s, nil, Identity{PID: i, UID: 1000, StartTime: 1}, t0.Add(time.Minute), DeviceReport{UUID: testUUID, Reserved: 1})
	}
}
