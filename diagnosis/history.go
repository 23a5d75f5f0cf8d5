package diagnosis

import (
	"sync"
	"time"
)

// Window is how far back a trend looks, and Bucket the span of time whose
// least and most active memory it keeps.
const (
	Window  = 5 * time.Minute
	Bucket  = 5 * time.Second
	buckets = int(Window/Bucket) + 1
	// minBuckets: a trend needs samples in this many buckets (20 s).
	minBuckets = 4
)

// Segments is how many stretches of equal time a trend is cut into.
const Segments = 4

// Trend is a process's active memory over the window before a failure:
// the least (floor) and the most (peak) of each of Segments stretches of
// equal time, oldest first.
type Trend struct {
	Span   time.Duration
	Floors [Segments]uint64
	Peaks  [Segments]uint64
}

// OK says whether there was enough history to call a trend.
func (t Trend) OK() bool { return t.Span > 0 }

// FloorRise is how much the floor climbed from the first stretch to the last.
func (t Trend) FloorRise() uint64 { return rise(t.Floors[0], t.Floors[Segments-1]) }

// PeakRise is how much the peak climbed from the first stretch to the last.
func (t Trend) PeakRise() uint64 { return rise(t.Peaks[0], t.Peaks[Segments-1]) }

// Peak is the highest active memory of the trend.
func (t Trend) Peak() uint64 {
	var p uint64
	for _, v := range t.Peaks {
		p = max(p, v)
	}
	return p
}

func rise(a, b uint64) uint64 {
	if b > a {
		return b - a
	}
	return 0
}

// Key names one process on one device: a reused pid is another process.
type Key struct {
	PID   uint32
	Start uint64
	UUID  string
}

// History keeps each process's active memory over the last Window, in
// buckets of Bucket: about 2.5 KiB per process and device.
type History struct {
	mu     sync.Mutex
	series map[Key]*series
}

type series struct {
	newest  int64
	buckets [buckets]bucket
}

type bucket struct {
	n      int64 // bucket number; valid only when ok
	lo, hi uint64
	loAt   int64 // when lo was sampled (Unix nanoseconds)
	ok     bool
}

// NewHistory returns an empty history.
func NewHistory() *History { return &History{series: map[Key]*series{}} }

func bucketNumber(t time.Time) int64 {
	ns := t.UnixNano()
	n := ns / int64(Bucket)
	if ns < 0 && ns%int64(Bucket) != 0 {
		n--
	}
	return n
}

// Note records active memory v of k sampled at t.
func (h *History) Note(k Key, t time.Time, v uint64) {
	n := bucketNumber(t)
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[k]
	if s == nil || n < s.newest-2*int64(buckets) {
		s = &series{newest: n}
		h.series[k] = s
	}
	if n <= s.newest-int64(buckets) {
		return
	}
	s.newest = max(s.newest, n)
	b := &s.buckets[((n%int64(buckets))+int64(buckets))%int64(buckets)]
	if !b.ok || b.n != n {
		*b = bucket{n: n, lo: v, hi: v, loAt: t.UnixNano(), ok: true}
		return
	}
	if v < b.lo {
		b.lo, b.loAt = v, t.UnixNano()
	}
	b.hi = max(b.hi, v)
}

// Retain forgets every process for which keep is false.
func (h *History) Retain(keep func(Key) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.series {
		if !keep(k) {
			delete(h.series, k)
		}
	}
}

// Len is how many processes the history holds.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.series)
}

// window is a copy of k's buckets of the Window that ends with bucket end,
// in no order.
func (h *History) window(k Key, end int64) []bucket {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[k]
	if s == nil {
		return nil
	}
	var got []bucket
	for _, b := range s.buckets {
		if b.ok && b.n <= end && b.n > end-int64(buckets) {
			got = append(got, b)
		}
	}
	return got
}

// Trend is k's trend over the Window that ends at t; not OK with samples
// in fewer than 20 s worth of buckets.
func (h *History) Trend(k Key, t time.Time) Trend {
	end := bucketNumber(t)
	got := h.window(k, end)
	if len(got) < minBuckets {
		return Trend{}
	}
	first, last := got[0].n, got[0].n
	for _, b := range got {
		first, last = min(first, b.n), max(last, b.n)
	}
	span := last - first + 1
	var tr Trend
	var seen [Segments]bool
	for _, b := range got {
		i := int((b.n - first) * Segments / span)
		if !seen[i] {
			tr.Floors[i], tr.Peaks[i], seen[i] = b.lo, b.hi, true
			continue
		}
		tr.Floors[i], tr.Peaks[i] = min(tr.Floors[i], b.lo), max(tr.Peaks[i], b.hi)
	}
	// A stretch without samples holds the value before it: memory stands
	// still while a process does not report a change.
	for i := 1; i < Segments; i++ {
		if !seen[i] {
			tr.Floors[i], tr.Peaks[i] = tr.Floors[i-1], tr.Peaks[i-1]
		}
	}
	tr.Span = time.Duration(span) * Bucket
	return tr
}
