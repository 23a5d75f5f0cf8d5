package allocstats

import "time"

// Size of the window of ActiveFloor: FloorBuckets buckets of FloorBucket,
// so the floor covers the last 2 minutes (2m to 2m10s, as the newest
// bucket fills).
const (
	FloorBucket  = 10 * time.Second
	FloorBuckets = 13
)

// ActiveFloor is the least active memory a process reported over the last
// FloorBuckets buckets of FloorBucket: the floor of a training step's
// sawtooth, which a client that reports about once a second lands on, and
// a scrape every 15 seconds mostly misses. The window ends at the newest
// sample's time, not at the reader's clock: a process that stops
// reporting keeps its last floor. The zero value holds no sample.
type ActiveFloor struct {
	seen    bool
	newest  int64 // bucket number of the newest sample
	buckets [FloorBuckets]floorBucket
}

type floorBucket struct {
	n   int64 // bucket number (time / FloorBucket); valid only when ok
	min uint64
	ok  bool
}

// bucketOf numbers the FloorBucket-long span that holds t.
func bucketOf(t time.Time) int64 {
	ns := t.UnixNano()
	n := ns / int64(FloorBucket)
	if ns < 0 && ns%int64(FloorBucket) != 0 {
		n-- // round towards minus infinity
	}
	return n
}

// Observe records active memory v sampled at t. A sample older than the
// window is ignored, unless it is so much older that the clock must have
// been set back: the window then starts again from it.
func (f *ActiveFloor) Observe(t time.Time, v uint64) {
	n := bucketOf(t)
	if !f.seen || n < f.newest-2*FloorBuckets {
		*f = ActiveFloor{seen: true, newest: n}
	}
	if n <= f.newest-FloorBuckets {
		return // late: the window has moved past it
	}
	f.newest = max(f.newest, n)
	b := &f.buckets[((n%FloorBuckets)+FloorBuckets)%FloorBuckets]
	if !b.ok || b.n != n {
		*b = floorBucket{n: n, min: v, ok: true}
		return
	}
	b.min = min(b.min, v)
}

// Floor returns the least active of the window, and false before any
// sample.
func (f *ActiveFloor) Floor() (uint64, bool) {
	var least uint64
	found := false
	for _, b := range f.buckets {
		if b.ok && b.n > f.newest-FloorBuckets && b.n <= f.newest && (!found || b.min < least) {
			least, found = b.min, true
		}
	}
	return least, found
}
