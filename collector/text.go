package collector

import (
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The text exposition format (version 0.0.4), written as expfmt writes it.

// appendHeader appends a family's # HELP and # TYPE lines.
func appendHeader(b []byte, f *family) []byte {
	b = append(b, "# HELP "...)
	b = append(b, f.name...)
	b = append(b, ' ')
	b = appendEscaped(b, f.help, false)
	b = append(b, "\n# TYPE "...)
	b = append(b, f.name...)
	switch f.typ {
	case prometheus.CounterValue:
		b = append(b, " counter\n"...)
	case prometheus.GaugeValue:
		b = append(b, " gauge\n"...)
	default:
		b = append(b, " untyped\n"...)
	}
	return b
}

// appendLabelValue appends v escaped for a quoted label value.
func appendLabelValue(b []byte, v string) []byte { return appendEscaped(b, v, true) }

// appendEscaped escapes backslash and newline, and the double quote when
// quoted, as expfmt does in help text and label values.
func appendEscaped(b []byte, s string, quoted bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, '\\', '\\')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '"' && quoted:
			b = append(b, '\\', '"')
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendFloat appends a sample value as expfmt writes it.
func appendFloat(b []byte, f float64) []byte {
	switch {
	case f == 1:
		return append(b, '1')
	case f == 0:
		return append(b, '0')
	case f == -1:
		return append(b, '-', '1')
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, +1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	case f == math.Trunc(f) && math.Abs(f) < 1<<53:
		return appendIntegral(b, int64(f))
	default:
		return strconv.AppendFloat(b, f, 'g', -1, 64)
	}
}

// appendIntegral writes an integer below 2^53 as strconv's shortest 'g'
// format writes it as a float64, at a fraction of the cost: byte counts
// are most of a scrape's values. Below 2^53 the shortest digits that read
// back as the same float64 are the integer's own, less trailing zeros;
// 'g' writes them plainly below 1e6 (exponent < 6) and as d.ddde+XX from
// there.
func appendIntegral(b []byte, n int64) []byte {
	if n < 0 {
		b = append(b, '-')
		n = -n
	}
	var buf [20]byte
	digits := strconv.AppendInt(buf[:0], n, 10)
	exp := len(digits) - 1
	if exp < 6 {
		return append(b, digits...)
	}
	for len(digits) > 1 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
	}
	b = append(b, digits[0])
	if len(digits) > 1 {
		b = append(b, '.')
		b = append(b, digits[1:]...)
	}
	b = append(b, 'e', '+')
	if exp < 10 {
		b = append(b, '0')
	}
	return strconv.AppendInt(b, int64(exp), 10)
}
