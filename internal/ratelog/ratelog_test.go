package ratelog

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestLimiterAllowsABurstThenOnePerInterval(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(3, time.Second)
	l.now = func() time.Time { return now }
	var got []bool
	for i := 0; i < 5; i++ {
		got = append(got, l.Allow())
	}
	if want := []bool{true, true, true, false, false}; !equal(got, want) {
		t.Fatalf("burst of 5 at once: allowed %v, want %v", got, want)
	}
	now = now.Add(1500 * time.Millisecond)
	if !l.Allow() {
		t.Error("1.5 s after the burst: want one line allowed")
	}
	if l.Allow() {
		t.Error("a second line within the same interval was allowed")
	}
	if n := l.Suppressed(); n != 3 {
		t.Errorf("Suppressed() = %d, want 3", n)
	}
}

func TestWarnDemotesToDebugBeyondTheBudget(t *testing.T) {
	var buf bytes.Buffer
	logger := log.NewLogfmtLogger(&buf)
	l := New(1, time.Hour)
	l.Warn(logger).Log("msg", "first")
	l.Warn(logger).Log("msg", "second")
	out := buf.String()
	if !strings.Contains(out, "level=warn msg=first") || !strings.Contains(out, "level=debug msg=second") {
		t.Errorf("log = %q, want the first line at warn and the second at debug", out)
	}
}

func equal(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSetCountsSuppressedLinesPerPath(t *testing.T) {
	var s Set
	a1 := s.Path("a", 1, time.Hour)
	a2 := s.Path("a", 1, time.Hour)
	b := s.Path("b", 1, time.Hour)
	for _, l := range []*Limiter{a1, a1, a1, a2, a2, b} {
		l.Warn(log.NewNopLogger())
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(&s)
	want := `
# HELP gpumem_log_messages_suppressed_total Log lines of a rate-limited warning path that went out at debug level instead of warn, by path.
# TYPE gpumem_log_messages_suppressed_total counter
gpumem_log_messages_suppressed_total{path="a"} 3
gpumem_log_messages_suppressed_total{path="b"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
