package tick

import (
	"testing"
	"time"
)

func TestNextFallsOnTheGridAtLeastHalfAPeriodAway(t *testing.T) {
	base := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC) // a whole second, minute and hour
	cases := []struct {
		now   time.Time
		every time.Duration
		want  time.Duration
	}{
		{base, time.Second, time.Second},
		{base.Add(200 * time.Microsecond), time.Second, time.Second - 200*time.Microsecond},
		{base.Add(500 * time.Millisecond), time.Second, 500 * time.Millisecond},
		{base.Add(600 * time.Millisecond), time.Second, 1400 * time.Millisecond},
		{base.Add(59*time.Minute + 59*time.Second), time.Hour, time.Hour + time.Second},
		{base.Add(10 * time.Minute), time.Hour, 50 * time.Minute},
		{base.Add(3 * time.Millisecond), 10 * time.Millisecond, 7 * time.Millisecond},
		{base, 0, 0},
		{base, -time.Second, 0},
	}
	for _, c := range cases {
		if got := Next(c.now, c.every); got != c.want {
			t.Errorf("Next(%s, %s) = %s, want %s", c.now.Format("15:04:05.000000"), c.every, got, c.want)
		}
		if c.every > 0 {
			if at := c.now.Add(Next(c.now, c.every)); at.UnixNano()%int64(c.every) != 0 {
				t.Errorf("Next(%s, %s) ends at %s, off the grid", c.now.Format("15:04:05.000000"), c.every, at.Format("15:04:05.000000"))
			}
		}
	}
}

// Two loops of one period that started at different times, whose work
// takes different times, wake at the same instants.
func TestLoopsOfOnePeriodShareTheirInstants(t *testing.T) {
	start := time.Date(2026, 12, 3, 14, 0, 0, 123456789, time.UTC)
	wakes := func(begin time.Time, work time.Duration) map[time.Time]bool {
		out := map[time.Time]bool{}
		at := begin
		for at.Before(start.Add(10 * time.Second)) {
			done := at.Add(work)
			at = done.Add(Next(done, time.Second))
			out[at] = true
		}
		return out
	}
	a, b := wakes(start, 300*time.Microsecond), wakes(start.Add(437*time.Millisecond), 2*time.Millisecond)
	for at := range a {
		if at.After(start.Add(2*time.Second)) && at.Before(start.Add(9*time.Second)) && !b[at] {
			t.Errorf("one loop wakes at %s, the other does not", at.Format("05.000000"))
		}
	}
}
