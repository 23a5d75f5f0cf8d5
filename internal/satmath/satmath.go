// Package satmath adds byte counts that must never wrap: a sum that would
// pass the largest uint64 stays there.
package satmath

import "math"

// Add is a+b, or math.MaxUint64 where that overflows.
func Add(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
