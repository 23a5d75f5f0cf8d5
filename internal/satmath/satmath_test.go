package satmath

import (
	"math"
	"testing"
)

func TestAddStopsAtTheMaximum(t *testing.T) {
	for _, tc := range []struct{ a, b, want uint64 }{
		{1, 2, 3},
		{math.MaxUint64 - 1, 1, math.MaxUint64},
		{math.MaxUint64, 1, math.MaxUint64},
		{math.MaxUint64, math.MaxUint64, math.MaxUint64},
	} {
		if got := Add(tc.a, tc.b); got != tc.want {
			t.Errorf("Add(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
