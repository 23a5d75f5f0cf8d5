// Package logging makes the exporter's logger (go-kit/log, logfmt or
// JSON, filtered by level) and bridges it to what libraries take: the
// *slog.Logger of exporter-toolkit and client-go, and promhttp's error log.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	slogkit "github.com/tjhop/slog-gokit"
	"k8s.io/klog/v2"
)

// New returns the project's logger (go-kit/log) writing to standard error
// in format (logfmt or json) at level (debug, info, warn, error) and
// above, and the same without timestamp and caller for the slog bridge:
// slog records carry their own time. Both write time=, as
// exporter-toolkit's lines do.
func New(lvl, format string) (logger, bare log.Logger) {
	return newTo(os.Stderr, lvl, format)
}

// Valuers of the project's logger, read when it is made; tests replace
// them.
var (
	logTimestamp = log.DefaultTimestampUTC
	// logCaller is the line that called Log: 5 frames up from the valuer,
	// through the timestamped logger's context, the level filter and the
	// caller's own context (log.With and level.X flatten into one).
	logCaller = log.Caller(5)
)

// newTo is New writing to w. The level filter is the outer logger, so
// that a line it drops never reads the clock or the caller's stack.
func newTo(w io.Writer, lvl, format string) (logger, bare log.Logger) {
	var base log.Logger
	if format == "json" {
		base = log.NewJSONLogger(log.NewSyncWriter(w))
	} else {
		base = log.NewLogfmtLogger(log.NewSyncWriter(w))
	}
	allow := level.Allow(level.ParseDefault(lvl, level.InfoValue()))
	bare = level.NewFilter(base, allow)
	logger = level.NewFilter(log.With(base, "time", logTimestamp, "caller", logCaller), allow)
	return logger, bare
}

// Slog is the one bridge from the project's logger to the *slog.Logger
// that exporter-toolkit and client-go (through klog) take.
func Slog(bare log.Logger, component string) *slog.Logger {
	return slog.New(slogkit.NewGoKitHandler(log.With(bare, "component", component), nil))
}

// RouteLibraryLogs sends client-go's klog lines to the project's logger,
// so that they have its format and level filter.
func RouteLibraryLogs(bare log.Logger) {
	klog.SetSlogLogger(Slog(bare, "client-go"))
}

// PromHTTP takes promhttp's error log. A scraper that went away (broken
// pipe, connection reset) is the scraper's business: one debug line, not
// an error.
type PromHTTP struct{ Logger log.Logger }

func (l PromHTTP) Println(v ...interface{}) {
	msg := fmt.Sprint(v...)
	lvl := level.Error
	if strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset by peer") {
		lvl = level.Debug
	}
	lvl(l.Logger).Log("msg", msg)
}
