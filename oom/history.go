package oom

// What a report reads from before its failure: the trend and the last
// forecast of the process's active memory (Trends), and each process's
// context from its last consistent reading (contexts).

import (
	"sync"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
)

// Trends is where a verdict reads the trend of the failing process's
// active memory and the last forecast of its time to OOM.
type Trends interface {
	Trend(k diagnosis.Key, at time.Time) diagnosis.Trend
	Forecast(k diagnosis.Key) (diagnosis.Forecast, bool)
}

// forecastAge is how old the last forecast before a failure may be for
// its verdict to read it.
const forecastAge = 2 * time.Minute

// trendBefore is the trend of ev's process up to its failure, and the
// last forecast of it if recent (nil: none); nothing without Trends.
func (r *Reports) trendBefore(ev allocstats.OOMEvent) (diagnosis.Trend, *diagnosis.Forecast) {
	t := r.cfg.Trends
	if t == nil {
		return diagnosis.Trend{}, nil
	}
	// The trend ends at the failure on the samples' own clock (the
	// simulated node's when simulated): the stats sent with the OOM.
	end := ev.Time
	if ev.Stats.HasStats && !ev.Stats.SampledAt.IsZero() {
		end = ev.Stats.SampledAt
	}
	k := diagnosis.Key{PID: ev.PID, Start: ev.StartTime, UUID: ev.UUID}
	trend := t.Trend(k, end)
	if !trend.OK() {
		// Noted without a start time: the store did not know it.
		k.Start = 0
		trend = t.Trend(k, end)
	}
	if fc, ok := t.Forecast(k); ok && end.Sub(fc.At) <= forecastAge {
		return trend, &fc
	}
	return trend, nil
}

// contexts remembers each process's context from a consistent reading
// (NVML used >= allocator reserved). A report whose fresh reading lags
// uses it, marked stale.
type contexts struct {
	mu   sync.Mutex
	last map[contextKey]uint64 // per process and device
}

type contextKey struct {
	pid   uint32
	start uint64
	uuid  string
}

func newContexts() *contexts { return &contexts{last: map[contextKey]uint64{}} }

// observe takes the join after a poll: the processes it no longer shows
// are forgotten.
func (c *contexts) observe(v attribution.View) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[contextKey]uint64, len(v.Rows))
	for i := range v.Rows {
		row := &v.Rows[i]
		if row.Alloc == nil {
			continue
		}
		k := contextKey{row.PID, row.Info.StartTime, row.UUID}
		if ctx, ok := row.Context(); ok {
			next[k] = ctx
		} else if old, ok := c.last[k]; ok {
			next[k] = old
		}
	}
	c.last = next
}

// lastOf is row's process's last consistent context on its device.
func (c *contexts) lastOf(row *attribution.Row) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, ok := c.last[contextKey{row.PID, row.Info.StartTime, row.UUID}]
	return ctx, ok
}
