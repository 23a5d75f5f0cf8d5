package diagnosis

import (
	"math"
	"slices"
	"time"
)

// Climb is a steady rise of a process's active memory, measured on its
// history: of its floor (what stays from step to step: a leak) or of the
// peak of its steps over a flat floor (a growing batch).
type Climb struct {
	// Cause is Leak when the floor climbs, Growth when only the peak does.
	Cause Cause
	// Rate is how fast the climbing series rose, in bytes per second.
	Rate float64
	// Span is how long it has climbed: the longest window of the history,
	// ending at its newest sample, that climbed in each of its stretches.
	Span time.Duration
	// From and To are the climbing series in the first and the last
	// stretch of the span (the floor for a leak, the peak for growth).
	From, To uint64
	// Level is the peak of active memory in the last stretch: what meets
	// the ceiling first.
	Level uint64
	// At is the time of the newest sample.
	At time.Time
}

// Forecast is when a climb would run the process out of memory.
type Forecast struct {
	Climb
	// Ceiling is what the allocator can hold at most: the process's
	// limit, or what it holds plus the GPU's free memory; CeilingIsLimit
	// says it is the limit.
	Ceiling        uint64
	CeilingIsLimit bool
	// ETA is how long until Level reaches Ceiling at Rate (0 when it has).
	ETA time.Duration
}

// What a climb must show (package diagnosis's thresholds are in
// docs/oom.md).
const (
	// climbTol is the least rise of a stretch that counts as a rise.
	climbTol = minMaterial / 32
	// minPeakShare: a climb of the peak alone must add this share of the
	// peak over its span (the batch-to-batch spread of steady training
	// stays under it).
	minPeakShare = 20
)

// climbWindows are the spans a climb is looked for in, longest first: the
// longest that climbs gives the rate. A climb needs at least the shortest
// (of the floor) to be told from a model's load, which takes a few
// seconds and then stays flat; a climb of the peak alone needs at least
// minPeakClimb.
var climbWindows = []time.Duration{Window, 2 * time.Minute, time.Minute, 30 * time.Second}

// minPeakClimb is the least span of a climb of the peak alone: a batch's
// peak varies from step to step, a growing batch over minutes.
const minPeakClimb = Window

// Foresee says when climb would reach ceiling.
func Foresee(c Climb, ceiling uint64, isLimit bool) Forecast {
	f := Forecast{Climb: c, Ceiling: ceiling, CeilingIsLimit: isLimit}
	if c.Level < ceiling && c.Rate > 0 {
		secs := float64(ceiling-c.Level) / c.Rate
		f.ETA = time.Duration(math.Min(secs, float64(math.MaxInt64/2)/1e9) * float64(time.Second))
	}
	return f
}

// Climb says whether k's active memory is climbing at end (the time of
// its newest sample), and how.
func (h *History) Climb(k Key, end time.Time) (Climb, bool) {
	endN := bucketNumber(end)
	got := h.window(k, endN)
	if len(got) < minBuckets {
		return Climb{}, false
	}
	slices.SortFunc(got, func(a, b bucket) int { return int(a.n - b.n) })
	for i, w := range climbWindows {
		if w == shortestWindow && i > 0 && covers(got, endN, climbWindows[i-1]) {
			// The shortest window speaks only for a process younger
			// than the next: in an older one, a climb of 30 s that the
			// minute around it does not show is a phase (an
			// evaluation keeping its graphs for a few batches), not a
			// leak.
			break
		}
		if c, ok := climbIn(got, endN, w); ok {
			c.At = end
			return c, true
		}
	}
	return Climb{}, false
}

// shortestWindow is the last of climbWindows.
var shortestWindow = climbWindows[len(climbWindows)-1]

// covers says whether the buckets bs (sorted oldest first) cover the
// window w that ends with bucket endN: samples in its first quarter, and
// in at least minBuckets buckets.
func covers(bs []bucket, endN int64, w time.Duration) bool {
	width := int64(w / Bucket)
	startN := endN - width + 1
	i, _ := slices.BinarySearchFunc(bs, startN, func(b bucket, n int64) int { return int(b.n - n) })
	in := bs[i:]
	return len(in) >= minBuckets && in[0].n <= startN+width/4
}

// climbIn looks for a climb in the buckets of the window w that ends with
// bucket endN. bs is sorted oldest first.
func climbIn(bs []bucket, endN int64, w time.Duration) (Climb, bool) {
	width := int64(w / Bucket)
	startN := endN - width + 1
	i, _ := slices.BinarySearchFunc(bs, startN, func(b bucket, n int64) int { return int(b.n - n) })
	in := bs[i:]
	if !covers(bs, endN, w) {
		return Climb{}, false
	}
	var floors, peaks, typical [Segments]uint64
	var highs [Segments][]uint64
	for _, b := range in {
		j := int((b.n - startN) * Segments / width)
		if len(highs[j]) == 0 {
			floors[j], peaks[j] = b.lo, b.hi
		}
		floors[j], peaks[j] = min(floors[j], b.lo), max(peaks[j], b.hi)
		highs[j] = append(highs[j], b.hi)
	}
	for j, hs := range highs {
		if len(hs) == 0 {
			return Climb{}, false // a stretch without samples says nothing
		}
		slices.Sort(hs)
		typical[j] = hs[len(hs)/2]
	}
	c := Climb{Span: w, Level: peaks[Segments-1]}
	switch {
	case floorClimbs(floors) && steadyRise(peaks) && (w >= Window || floorOverSteps(floors, peaks)):
		c.Cause, c.From, c.To = Leak, floors[0], floors[Segments-1]
		// Each floor at the moment it was sampled, leaving out the
		// newest bucket: it may hold a sample or two, not yet a low.
		c.Rate = slope(in[:len(in)-1])
	case w >= minPeakClimb && peakClimbs(floors, typical) && rise(peaks[0], peaks[Segments-1]) >= rise(typical[0], typical[Segments-1])/2:
		// The typical peak of a stretch (the median of its buckets'): a
		// batch much larger than the others, now and then, raises the
		// stretch's highest peak, not its typical one.
		c.Cause, c.From, c.To = Growth, typical[0], typical[Segments-1]
		// From the middle of the first stretch to that of the last.
		c.Rate = float64(typical[Segments-1]-typical[0]) / (w.Seconds() * (Segments - 1) / Segments)
	default:
		return Climb{}, false
	}
	return c, c.Rate > 0
}

// floorClimbs: the floor rose steadily (steadyRise) and by minMaterial in
// all (a model's load, one step up, is not a climb, nor is a window that
// holds one), from more than nothing: a floor that starts at nothing is a
// process that starts, and its first allocations are its model's load.
func floorClimbs(f [Segments]uint64) bool {
	return f[0] > climbTol && steadyRise(f) && f[Segments-1]-f[0] >= minMaterial
}

// steadyRise: the series rose in every stretch, by climbTol at least, and
// no stretch holds more than maxStretchShare of its rise. A leak's peak
// climbs with its floor (each step adds its working set to what stays);
// the lows that 1-second samples catch of long steps vary from step to
// step and may rise by chance over a short window while the peaks stay
// level, and an evaluation that keeps its graphs steps the peak up once.
func steadyRise(v [Segments]uint64) bool {
	var most uint64
	for i := 1; i < Segments; i++ {
		if v[i] <= v[i-1]+climbTol {
			return false
		}
		most = max(most, v[i]-v[i-1])
	}
	return float64(most) <= maxStretchShare*float64(v[Segments-1]-v[0])
}

// floorOverSteps: the floor rose by more than half the height of the
// steps above it (the least, over the stretches, of peak minus floor). A
// window shorter than Window holds few steps of a long step: the lows
// that 1-second samples catch of them vary by a part of the step's
// height, and may line up by chance; a leak that kills within minutes
// climbs by more than that (one that keeps everything a step allocates
// climbs with no steps at all).
func floorOverSteps(f, p [Segments]uint64) bool {
	height := p[0] - f[0]
	for i := 1; i < Segments; i++ {
		height = min(height, p[i]-f[i])
	}
	return f[Segments-1]-f[0] > height/2
}

// maxStretchShare is the most of a climb's rise that one of its stretches
// may hold: a steady climb spreads it (a third each).
const maxStretchShare = 0.6

// peakClimbs: the peak never fell, rose in at least two stretches and in
// all by a twentieth of itself (and minMaterial), no stretch holding more
// than maxStretchShare of the rise (a batch much larger than the others,
// now and then, is no growth), stands highest in the last stretch, while
// the floor rose by less than a quarter of that.
func peakClimbs(f, p [Segments]uint64) bool {
	top := slices.Max(p[:])
	if p[Segments-1] < top {
		return false
	}
	ups := 0
	var most uint64
	for i := 1; i < Segments; i++ {
		if p[i]+top/200 < p[i-1] {
			return false
		}
		if p[i] > p[i-1]+max(climbTol, top/100) {
			ups++
		}
		most = max(most, rise(p[i-1], p[i]))
	}
	r := rise(p[0], p[Segments-1])
	return ups >= 2 && r >= max(uint64(minMaterial), top/minPeakShare) && float64(most) <= maxStretchShare*float64(r) &&
		rise(f[0], f[Segments-1]) < r/4
}

// slope is the least-squares rate of the buckets' floors over the times
// they were sampled, in bytes per second.
func slope(bs []bucket) float64 {
	n := float64(len(bs))
	var sx, sy float64
	for _, b := range bs {
		sx += float64(b.loAt) / 1e9
		sy += float64(b.lo)
	}
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for _, b := range bs {
		dx := float64(b.loAt)/1e9 - mx
		sxy += dx * (float64(b.lo) - my)
		sxx += dx * dx
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}
