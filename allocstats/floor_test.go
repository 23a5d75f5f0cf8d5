package allocstats

import (
	"testing"
	"time"
)

func TestActiveFloorIsTheLeastOfTheLastTwoMinutes(t *testing.T) {
	t.Parallel()
	var f ActiveFloor
	if _, ok := f.Floor(); ok {
		t.Fatal("a floor without samples")
	}
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// A sawtooth once a second: 100 at the floor every 5th second, 500 in
	// between.
	for s := 0; s < 60; s++ {
		v := uint64(500)
		if s%5 == 0 {
			v = 100
		}
		f.Observe(at(float64(s)), v)
	}
	if got, _ := f.Floor(); got != 100 {
		t.Errorf("floor of a sawtooth = %d, want its low 100", got)
	}
	// The floor rises; the old low leaves the window after 2 to 2m10s.
	for s := 60; s < 300; s++ {
		f.Observe(at(float64(s)), 300)
		got, _ := f.Floor()
		switch {
		case s < 55+120 && got != 100:
			t.Fatalf("at %ds floor = %d, want 100 (the low at 55s is in the window)", s, got)
		case s >= 55+130 && got != 300:
			t.Fatalf("at %ds floor = %d, want 300 (the low at 55s left the window)", s, got)
		}
	}
	// A late sample inside the window counts; one older than it does not.
	f.Observe(at(250), 200)
	if got, _ := f.Floor(); got != 200 {
		t.Errorf("after a late sample of 200 within the window, floor = %d", got)
	}
	f.Observe(at(100), 50)
	if got, _ := f.Floor(); got != 200 {
		t.Errorf("after a sample older than the window, floor = %d, want 200", got)
	}
	// A clock set back far starts the window again.
	f.Observe(at(-3600), 700)
	if got, _ := f.Floor(); got != 700 {
		t.Errorf("after the clock went back an hour, floor = %d, want 700", got)
	}
}

func TestStoreExportsTheFloorOfActiveAtTheSampleTime(t *testing.T) {
	t.Parallel()
	s := NewStore(time.Minute)
	session := s.Open(Identity{PID: 42, StartTime: 7}, 0)
	arrival := time.Unix(1_700_000_000, 0)
	feed := func(sampled time.Time, active uint64) DeviceStats {
		t.Helper()
		r := DeviceReport{UUID: testUUID, Reserved: 1 << 30, Active: Some(active), At: sampled}
		if err := session.Stats([]DeviceReport{r}, arrival); err != nil {
			t.Fatal(err)
		}
		p, _ := s.Process(42)
		d, _ := p.Device(testUUID)
		return d
	}
	if err := session.Stats([]DeviceReport{{UUID: testUUID, Reserved: 1 << 30}}, arrival); err != nil {
		t.Fatal(err)
	}
	p, _ := s.Process(42)
	if d, _ := p.Device(testUUID); d.ActiveFloor.OK {
		t.Errorf("floor %d before any active was reported, want none", d.ActiveFloor.V)
	}
	// Sample times an hour apart, all arriving at once (a fast
	// simulation): each is a window of its own.
	feed(arrival, 100)
	if d := feed(arrival.Add(time.Hour), 300); d.ActiveFloor != Some(300) {
		t.Errorf("floor = %+v an hour of sample time after a low of 100, want 300", d.ActiveFloor)
	}
	if d := feed(arrival.Add(time.Hour+time.Second), 400); d.ActiveFloor != Some(300) {
		t.Errorf("floor = %+v, want 300", d.ActiveFloor)
	}
	// Without a sample time, the arrival time counts.
	if d := feed(time.Time{}, 50); d.ActiveFloor != Some(50) {
		t.Errorf("floor = %+v after a report of 50 without a sample time, want 50", d.ActiveFloor)
	}
}
