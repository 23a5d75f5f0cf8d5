package foresight

import (
	"math"
	"time"

	"github.com/gpumem/gpumem_exporter/diagnosis"
)

// HoldFor is how long a forecast outlives the last poll that measured its
// climb, as it was (not counted down: a climb no longer measured does not
// bring a warning closer): a growing batch stays flat between its steps, and
// the stretches of a climb that 1-second samples catch do not all rise at
// every poll, so that a climb measured at one poll may not be at the
// next. Without it the estimate, the alert that reads it and the warnings
// would come and go while the process climbs on.
const HoldFor = 4 * time.Minute

// smoothing is the time constant over which a forecast's rate follows the
// climbs measured at successive polls.
const smoothing = 30 * time.Second

// Tracker keeps each process's active memory and the forecast measured on
// it. The Forecaster keeps one; the alerts' lead-time test measures a
// simulated node's processes with another. Note may be called from any
// goroutine; the other methods are not safe for concurrent use.
type Tracker struct {
	history *diagnosis.History
	held    map[diagnosis.Key]diagnosis.Forecast // the last forecast measured on a climb
}

// NewTracker returns a Tracker that has seen nothing.
func NewTracker() *Tracker {
	return &Tracker{history: diagnosis.NewHistory(), held: map[diagnosis.Key]diagnosis.Forecast{}}
}

// Note records process k's active memory at at.
func (t *Tracker) Note(k diagnosis.Key, at time.Time, active uint64) { t.history.Note(k, at, active) }

// Forecast measures k's climb at at (the time of its newest sample) and
// says when it would reach ceiling: the forecast of the climb measured
// now (its rate smoothed over the polls), else the last one measured
// within HoldFor.
func (t *Tracker) Forecast(k diagnosis.Key, at time.Time, ceiling uint64, isLimit bool) (diagnosis.Forecast, bool) {
	last, held := t.held[k]
	if held && (at.Sub(last.At) > HoldFor || at.Before(last.At)) {
		delete(t.held, k)
		held = false
	}
	if c, ok := t.history.Climb(k, at); ok {
		if held {
			// The rate, smoothed over the polls: a climb is measured
			// on the longest window that shows it, and a window that
			// does at one poll may not at the next.
			w := 1 - math.Exp(-at.Sub(last.At).Seconds()/smoothing.Seconds())
			c.Rate = last.Rate + w*(c.Rate-last.Rate)
		}
		fc := diagnosis.Foresee(c, ceiling, isLimit)
		t.held[k] = fc
		return fc, true
	}
	if !held {
		return diagnosis.Forecast{}, false
	}
	return last, true
}

// Trend is k's trend over the window that ends at at.
func (t *Tracker) Trend(k diagnosis.Key, at time.Time) diagnosis.Trend { return t.history.Trend(k, at) }

// Forget drops process k.
func (t *Tracker) Forget(k diagnosis.Key) {
	delete(t.held, k)
	t.history.Retain(func(h diagnosis.Key) bool { return h != k })
}

// Retain forgets every process for which keep is false.
func (t *Tracker) Retain(keep func(diagnosis.Key) bool) {
	for k := range t.held {
		if !keep(k) {
			delete(t.held, k)
		}
	}
	t.history.Retain(keep)
}
