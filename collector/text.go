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
	default:
		return strconv.AppendFloat(b, f, 'g', -1, 64)
	}
}
