package main

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

// newLogger returns the project's logger (go-kit/log), and the same
// without timestamp and caller for the slog bridge: slog records carry
// their own time. Both write time=, as exporter-toolkit's lines do.
func newLogger(o *options) (logger, bare log.Logger) {
	return newLoggerTo(os.Stderr, o)
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

// newLoggerTo is newLogger writing to w. The level filter is the outer
// logger, so that a line it drops never reads the clock or the caller's
// stack.
func newLoggerTo(w io.Writer, o *options) (logger, bare log.Logger) {
	var base log.Logger
	if o.logFormat == "json" {
		base = log.NewJSONLogger(log.NewSyncWriter(w))
	} else {
		base = log.NewLogfmtLogger(log.NewSyncWriter(w))
	}
	allow := level.Allow(level.ParseDefault(o.logLevel, level.InfoValue()))
	bare = level.NewFilter(base, allow)
	logger = level.NewFilter(log.With(base, "time", logTimestamp, "caller", logCaller), allow)
	return logger, bare
}

// slogLogger is the one bridge from the project's logger to the
// *slog.Logger that exporter-toolkit and client-go (through klog) take.
func slogLogger(bare log.Logger, component string) *slog.Logger {
	return slog.New(slogkit.NewGoKitHandler(log.With(bare, "component", component), nil))
}

// routeLibraryLogs sends client-go's klog lines to the project's logger,
// so that they have its format and level filter.
func routeLibraryLogs(bare log.Logger) {
	klog.SetSlogLogger(slogLogger(bare, "client-go"))
}

// promhttpLogger takes promhttp's error log. A scraper that went away
// (broken pipe, connection reset) is the scraper's business: one debug
// line, not an error.
type promhttpLogger struct{ logger log.Logger }

func (l promhttpLogger) Println(v ...interface{}) {
	msg := fmt.Sprint(v...)
	lvl := level.Error
	if strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset by peer") {
		lvl = level.Debug
	}
	lvl(l.logger).Log("msg", msg)
}
