// Package tick spaces the daemon's periodic work on a shared grid: the
// whole multiples of a period since the Unix epoch. Two loops with the
// same period (the NVML poll and the socket check, both every second by
// default) then fall due at the same instant, and an idle daemon wakes
// once a second instead of once per loop.
package tick

import "time"

// Next returns how long to wait from now until the first multiple of every
// (since the Unix epoch) that is at least every/2 away, so that the first
// wait after an unaligned start is never a sliver. every <= 0 gives 0.
func Next(now time.Time, every time.Duration) time.Duration {
	if every <= 0 {
		return 0
	}
	d := every - time.Duration(now.UnixNano()%int64(every))
	if d < every/2 {
		d += every
	}
	return d
}
