package main

import (
	"fmt"
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
	if o.logFormat == "json" {
		bare = log.NewJSONLogger(log.NewSyncWriter(os.Stderr))
	} else {
		bare = log.NewLogfmtLogger(log.NewSyncWriter(os.Stderr))
	}
	bare = level.NewFilter(bare, level.Allow(level.ParseDefault(o.logLevel, level.InfoValue())))
	return log.With(bare, "time", log.DefaultTimestampUTC, "caller", log.DefaultCaller), bare
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
