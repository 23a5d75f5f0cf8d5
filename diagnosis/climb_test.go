package diagnosis

import (
	"math"
	"testing"
	"time"
)

// sampled notes a process's active memory once a second for d, as a client
// pushes it, from f(t) (t the seconds since the start).
func sampled(d time.Duration, f func(t float64) uint64) (*History, Key, time.Time) {
	h := NewHistory()
	k := Key{PID: 1, Start: 1, UUID: "GPU-x"}
	t0 := time.Unix(1_800_000_000, 0)
	var at time.Time
	for s := 0; s < int(d.Seconds()); s++ {
		at = t0.Add(time.Duration(s) * time.Second)
		h.Note(k, at, f(float64(s)))
	}
	return h, k, at
}

// sawtooth is a training step: active memory goes from floor to floor+amp
// and back every period seconds.
func sawtooth(t, period float64, floor, amp uint64) uint64 {
	phase := math.Mod(t, period) / period
	return floor + uint64(phase*float64(amp))
}

const gib = 1 << 30

func TestClimbTellsALeakOrAGrowingBatchFromWhatIsNoClimb(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name      string
		d         time.Duration
		f         func(t float64) uint64
		want      Cause // "" for no climb
		wantRate  float64
		rateSlack float64
	}{
		{"a leak of 77 MiB a second, 40 s", 40 * time.Second,
			func(t float64) uint64 { return 64*mib + uint64(t)*77*mib }, Leak, 77 * mib, 0.1},
		{"a leak under a sawtooth, 29 MiB a second, 3 minutes", 3 * time.Minute,
			func(t float64) uint64 { return sawtooth(t, 1.3, gib+uint64(t)*29*mib, 2*gib) }, Leak, 29 * mib, 0.1},
		{"a young leak under a sawtooth, 48 MiB a second, 40 s", 40 * time.Second,
			func(t float64) uint64 { return sawtooth(t, 3, gib+uint64(t)*48*mib, 384*mib) }, Leak, 48 * mib, 0.02},
		{"a slow leak of 1 MiB a second, 5 minutes", 5 * time.Minute,
			func(t float64) uint64 { return sawtooth(t, 2, 10*gib+uint64(t)*mib, 4*gib) }, Leak, mib, 0.2},
		{"steady training", 5 * time.Minute,
			func(t float64) uint64 { return sawtooth(t, 1.7, 20*gib, 30*gib) }, "", 0, 0},
		{"a model's load, then steady training", 2 * time.Minute,
			func(t float64) uint64 {
				if t < 20 {
					return 0
				}
				w := min(uint64(t-20), 4) * 5 * gib
				if t < 25 {
					return w
				}
				return sawtooth(t, 1, w, 10*gib)
			}, "", 0, 0},
		{"an evaluation spike", 5 * time.Minute,
			func(t float64) uint64 {
				if t > 200 && t < 240 {
					return sawtooth(t, 1, 20*gib, 60*gib)
				}
				return sawtooth(t, 1, 20*gib, 10*gib)
			}, "", 0, 0},
		{"an idle notebook", 5 * time.Minute, func(float64) uint64 { return 3 * gib }, "", 0, 0},
		{"a model's load from nothing, 30 s of chunks", 30 * time.Second,
			func(t float64) uint64 { return uint64(t) * gib }, "", 0, 0},
		{"tall steps whose lows creep up, 90 s", 90 * time.Second,
			// Too little in 90 s to tell from the lows that 1-second
			// samples catch of long steps.
			func(t float64) uint64 { return sawtooth(t, 6.5, 40*gib+uint64(t)*8*mib, 50*gib+uint64(t)*8*mib) }, "", 0, 0},
		{"a batch that grows every 30 s over a flat floor", 5 * time.Minute,
			// Sampled once a second, a 1.5 s step shows at most two
			// thirds of its top: so does the peak's climb.
			func(t float64) uint64 { return sawtooth(t, 1.5, 20*gib, 10*gib+uint64(t/30)*gib) }, Growth, gib / 30.0 * 2 / 3, 0.15},
		{"a growing batch is not called a climb in its first minute", time.Minute,
			func(t float64) uint64 { return sawtooth(t, 1.5, 20*gib, 10*gib+uint64(t/10)*gib) }, "", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, k, end := sampled(tt.d, tt.f)
			c, ok := h.Climb(k, end)
			if tt.want == "" {
				if ok {
					t.Fatalf("climb %+v, want none", c)
				}
				return
			}
			if !ok || c.Cause != tt.want {
				t.Fatalf("climb %+v (found %v), want a %s", c, ok, tt.want)
			}
			if math.Abs(c.Rate-tt.wantRate) > tt.rateSlack*tt.wantRate {
				t.Errorf("rate %.1f MiB/s, want %.1f MiB/s within %.0f%%", c.Rate/mib, tt.wantRate/mib, 100*tt.rateSlack)
			}
		})
	}
}

func TestForeseeSaysWhenTheLevelReachesTheCeiling(t *testing.T) {
	c := Climb{Cause: Leak, Rate: 100 << 20, Level: 4 * gib}
	if got := Foresee(c, 9*gib, true).ETA; got != 51*time.Second+200*time.Millisecond {
		t.Errorf("ETA %v, want 51.2s (5 GiB at 100 MiB/s)", got)
	}
	if got := Foresee(Climb{Rate: 1, Level: 10 * gib}, 9*gib, false).ETA; got != 0 {
		t.Errorf("ETA past the ceiling %v, want 0", got)
	}
}
