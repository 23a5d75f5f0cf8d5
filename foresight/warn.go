package foresight

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/go-kit/log/level"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
)

// How often a process is warned again (on the samples' clock).
const (
	// MinWarnInterval: never more than one warning a minute.
	MinWarnInterval = time.Minute
	// QuietPeriod: a process still under its threshold is warned again
	// after this long even when the estimate held.
	QuietPeriod = 5 * time.Minute
	// materialChange: a warning is sent again sooner when the estimate
	// moved from what the last one foresaw by this share (and by
	// minMaterialChange).
	materialChange    = 0.25
	minMaterialChange = 30 * time.Second
)

// threshold is the estimate under which process r is warned: what it asked
// for in its hello, else the daemon's. 0: never.
func (f *Forecaster) threshold(r *attribution.Row) time.Duration {
	t := f.cfg.WarnBefore
	if f.cfg.Clients != nil {
		if p, ok := f.cfg.Clients.Process(r.PID); ok && (r.AllocStart() == 0 || p.StartTime == r.AllocStart()) && p.WarnBefore.OK {
			secs := min(p.WarnBefore.V, uint64(math.MaxInt64/int64(time.Second)))
			t = time.Duration(secs) * time.Second
		}
	}
	return max(t, 0)
}

// Schedule says when a process under its threshold is warned: at once the
// first time, then never within MinWarnInterval of the last warning or
// out-of-memory error, again
// when the estimate moved materially from what the last one foresaw, and
// after QuietPeriod even when it held. Its clock is the forecasts' (the
// samples'). The Forecaster keeps one; the alerts' lead-time test counts
// the warnings a simulated node would get with another. It is not safe for
// concurrent use.
type Schedule struct {
	last map[diagnosis.Key]warned
}

// NewSchedule returns a Schedule that has warned no process.
func NewSchedule() *Schedule { return &Schedule{last: map[diagnosis.Key]warned{}} }

// Warn says whether process k, whose threshold is threshold (0: never),
// is to be warned of fc now, and if so notes that it was.
func (s *Schedule) Warn(k diagnosis.Key, fc diagnosis.Forecast, threshold time.Duration) bool {
	if threshold <= 0 || fc.ETA >= threshold {
		return false
	}
	last, ok := s.last[k]
	if !due(last, ok, fc) {
		return false
	}
	s.last[k] = warned{at: fc.At, eta: fc.ETA}
	return true
}

// Failed notes that process k raised an out-of-memory error at at: its
// verdict is on its way, and a process that dies of it is not warned in
// the seconds it has left; one that caught it and climbs on is warned
// again a minute later.
func (s *Schedule) Failed(k diagnosis.Key, at time.Time) { s.last[k] = warned{at: at} }

// Forget drops what the schedule knows of process k.
func (s *Schedule) Forget(k diagnosis.Key) { delete(s.last, k) }

// due says whether a process last warned at last should be warned of fc
// now.
func due(last warned, warnedBefore bool, fc diagnosis.Forecast) bool {
	if !warnedBefore {
		return true
	}
	since := fc.At.Sub(last.at)
	if since < MinWarnInterval {
		return false
	}
	if since >= QuietPeriod {
		return true
	}
	expected := last.eta - since
	moved := fc.ETA - expected
	if moved < 0 {
		moved = -moved
	}
	return moved >= max(minMaterialChange, time.Duration(materialChange*float64(max(expected, 0))))
}

// warning decides whether to warn r of fc and builds the message; f.mu is
// held.
func (f *Forecaster) warning(r *attribution.Row, k diagnosis.Key, fc diagnosis.Forecast) (outgoing, bool) {
	if f.cfg.WarnBefore < 0 || f.cfg.Clients == nil {
		return outgoing{}, false
	}
	if !f.schedule.Warn(k, fc, f.threshold(r)) {
		return outgoing{}, false
	}
	w := Message(r.GPU, r.UUID, fc)
	line, err := w.Line()
	if err != nil {
		return outgoing{}, false
	}
	level.Debug(f.logger).Log("msg", "foreseen out of memory", "pid", r.PID, "gpu", r.GPU, "eta_seconds", int(fc.ETA.Seconds()))
	return outgoing{pid: r.PID, start: r.AllocStart(), line: line, cause: fc.Cause}, true
}

// send delivers a batch of warnings, logs and counts them.
func (f *Forecaster) send(batch []outgoing) {
	for _, o := range batch {
		n := f.cfg.Clients.Send(o.pid, o.start, o.line)
		f.sent.WithLabelValues(string(o.cause), strconv.FormatBool(n > 0)).Inc()
		f.logs.Warn(f.logger).Log("msg", "out of memory foreseen; the process was warned", "pid", o.pid, "cause", o.cause, "delivered", n > 0, "warning", string(o.line[:len(o.line)-1]))
	}
}

// Message is the warning of fc to the process on GPU gpu (uuid).
func Message(gpu, uuid string, fc diagnosis.Forecast) wire.Warning {
	ceiling := "gpu"
	if fc.CeilingIsLimit {
		ceiling = "limit"
	}
	return wire.Warning{
		GPU:                 gpu,
		UUID:                uuid,
		ETASeconds:          math.Round(fc.ETA.Seconds()),
		ClimbBytesPerMinute: uint64(fc.Rate * 60),
		ActiveBytes:         fc.Level,
		CeilingBytes:        fc.Ceiling,
		Ceiling:             ceiling,
		ClimbSeconds:        fc.Span.Seconds(),
		Cause:               string(fc.Cause),
		Summary:             Summary(fc),
		Remedy:              diagnosis.RemedyOf(fc.Cause),
	}
}

// Summary says in one sentence what climbs, how fast and when it would
// run out.
func Summary(fc diagnosis.Forecast) string {
	what := "Active memory's floor (what stays from step to step)"
	if fc.Cause == diagnosis.Growth {
		what = "The peak of active memory (each step's top, over a flat floor)"
	}
	ceiling := fmt.Sprintf("what the allocator can hold on this GPU (%s: what it holds plus the GPU's free memory)", diagnosis.GiB(fc.Ceiling))
	if fc.CeilingIsLimit {
		ceiling = fmt.Sprintf("the process's limit of %s", diagnosis.GiB(fc.Ceiling))
	}
	return fmt.Sprintf("%s climbed from %s to %s in the last %s, %s a minute; at this rate active memory (%s now) reaches %s in about %s, and the next allocation then fails with CUDA out of memory.",
		what, diagnosis.GiB(fc.From), diagnosis.GiB(fc.To), Duration(fc.Span), diagnosis.GiB(uint64(fc.Rate*60)), diagnosis.GiB(fc.Level), ceiling, Duration(fc.ETA))
}

// Duration says d as a person would: "45 s", "3 minutes", "2.5 hours"
// (the warnings and the landing page).
func Duration(d time.Duration) string {
	switch s := d.Seconds(); {
	case s < 120:
		return fmt.Sprintf("%.0f s", s)
	case s < 2*3600:
		return fmt.Sprintf("%.0f minutes", s/60)
	default:
		return fmt.Sprintf("%.1f hours", s/3600)
	}
}
