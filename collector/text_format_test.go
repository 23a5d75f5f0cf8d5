package collector

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// appendFloat writes what expfmt writes: strconv's shortest 'g' format
// but for 0, 1, -1, NaN and the infinities.
func TestAppendFloatIsExpfmts(t *testing.T) {
	values := []float64{0, 1, -1, 2, -2, 10, 999999, 1e6, 1000001, 1234567, -1234567, 1 << 30, 1.5 * (1 << 30),
		1<<53 - 1, 1 << 53, 1<<53 + 2, 1e21, 1e22, 143771 << 20, 0.5, 1.75e9, 1.750000001e9, -0.25, math.MaxUint64,
		math.SmallestNonzeroFloat64, math.MaxFloat64, 100, 120, 1e5, 1e15, 12345678901234567}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		values = append(values, float64(r.Int64N(1<<53)), float64(r.Int64N(1<<40)), float64(r.Int64N(1<<20)<<30), r.Float64()*1e12)
	}
	for _, v := range values {
		want := strconv.FormatFloat(v, 'g', -1, 64)
		switch v {
		case 0:
			want = "0"
		case 1:
			want = "1"
		case -1:
			want = "-1"
		}
		if got := string(appendFloat(nil, v)); got != want {
			t.Fatalf("appendFloat(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{math.NaN(): "NaN", math.Inf(1): "+Inf", math.Inf(-1): "-Inf"} {
		if got := string(appendFloat(nil, v)); got != want {
			t.Errorf("appendFloat(%v) = %q, want %q", v, got, want)
		}
	}
}
