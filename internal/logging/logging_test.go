package logging

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
)

// A line names the file and line that logged it, also through a
// component's logger; a line the level drops reads neither the clock nor
// the stack (the timestamp stands for both: they are evaluated together).
func TestLogLinesNameTheirCallerAndDroppedLinesCostNoValuers(t *testing.T) {
	var evaluated int
	oldTime, oldCaller := logTimestamp, logCaller
	defer func() { logTimestamp, logCaller = oldTime, oldCaller }()
	// The caller's valuer is left as it is: a wrapper would add a frame.
	logTimestamp = func() any { evaluated++; return oldTime() }

	var buf bytes.Buffer
	logger, _ := newTo(&buf, "info", "logfmt")
	component := log.With(logger, "component", "nvml")

	level.Debug(component).Log("msg", "dropped")
	level.Debug(logger).Log("msg", "dropped too")
	if buf.Len() != 0 || evaluated != 0 {
		t.Errorf("debug lines at level info: wrote %q, read the clock %d times; want nothing", buf.String(), evaluated)
	}

	_, file, line, _ := runtime.Caller(0)
	level.Info(component).Log("msg", "kept")
	level.Warn(logger).Log("msg", "kept too")
	want := []string{
		fmt.Sprintf("caller=%s:%d", shortFile(file), line+1),
		fmt.Sprintf("caller=%s:%d", shortFile(file), line+2),
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("wrote %d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		if !strings.Contains(l, want[i]) || !strings.Contains(l, "time=") {
			t.Errorf("line %d = %q; want time= and %s", i+1, l, want[i])
		}
	}
	if !strings.Contains(lines[0], "component=nvml") || !strings.Contains(lines[0], "level=info") {
		t.Errorf("line 1 = %q; want its component and level", lines[0])
	}
}

func shortFile(path string) string {
	return path[strings.LastIndex(path, "/")+1:]
}
