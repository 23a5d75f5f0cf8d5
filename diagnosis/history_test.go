package diagnosis

import (
	"testing"
	"time"
)

func TestHistoryTrendOfALeakAndOfASawtooth(t *testing.T) {
	h := NewHistory()
	t0 := time.Unix(1_000_000, 0)
	leak, saw := Key{PID: 1, Start: 10, UUID: "GPU-a"}, Key{PID: 2, Start: 20, UUID: "GPU-a"}
	for s := 0; s < 120; s++ {
		at := t0.Add(time.Duration(s) * time.Second)
		h.Note(leak, at, uint64(s)*128*MiB)       // the floor climbs every second
		h.Note(saw, at, 10*GiB_+uint64(s%3)*GiB_) // a flat sawtooth
	}
	end := t0.Add(119 * time.Second)
	lt := h.Trend(leak, end)
	if !lt.OK() || lt.Span != 120*time.Second {
		t.Fatalf("leak trend %+v: want 120 s of it", lt)
	}
	if lt.FloorRise() < 10*GiB_ {
		t.Errorf("leak's floor rose %d bytes, want over 10 GiB (15 GiB in 2 minutes)", lt.FloorRise())
	}
	st := h.Trend(saw, end)
	if st.FloorRise() != 0 || st.PeakRise() != 0 || st.Floors[0] != 10*GiB_ || st.Peak() != 12*GiB_ {
		t.Errorf("sawtooth trend %+v: want a flat floor of 10 GiB and a flat peak of 12 GiB", st)
	}
}

func TestHistoryNeedsTwentySecondsAndForgetsBeyondTheWindow(t *testing.T) {
	h := NewHistory()
	k := Key{PID: 1, UUID: "GPU-a"}
	t0 := time.Unix(2_000_000, 0)
	for s := 0; s < 15; s++ {
		h.Note(k, t0.Add(time.Duration(s)*time.Second), GiB_)
	}
	if tr := h.Trend(k, t0.Add(15*time.Second)); tr.OK() {
		t.Errorf("trend from 15 s of samples: %+v, want none", tr)
	}
	if tr := h.Trend(k, t0.Add(Window+time.Minute)); tr.OK() {
		t.Errorf("trend a minute past the window: %+v, want none", tr)
	}
	if tr := h.Trend(Key{PID: 9}, t0); tr.OK() {
		t.Errorf("trend of an unknown process: %+v", tr)
	}
	h.Retain(func(Key) bool { return false })
	if h.Len() != 0 {
		t.Errorf("Retain(none) left %d", h.Len())
	}
}

func TestHistoryAReusedPidIsAnotherProcess(t *testing.T) {
	h := NewHistory()
	t0 := time.Unix(3_000_000, 0)
	old, reused := Key{PID: 7, Start: 1, UUID: "GPU-a"}, Key{PID: 7, Start: 2, UUID: "GPU-a"}
	for s := 0; s < 60; s++ {
		h.Note(old, t0.Add(time.Duration(s)*time.Second), uint64(s)*GiB_)
	}
	if tr := h.Trend(reused, t0.Add(time.Minute)); tr.OK() {
		t.Errorf("the reused pid inherited a trend: %+v", tr)
	}
}
