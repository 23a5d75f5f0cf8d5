package main

import (
	"log/slog"

	"github.com/go-kit/log"
	slogkit "github.com/tjhop/slog-gokit"
)

// slogkitLogger bridges the project's go-kit logger to the *slog.Logger
// that exporter-toolkit takes.
func slogkitLogger(logger log.Logger) *slog.Logger {
	return slog.New(slogkit.NewGoKitHandler(logger, nil))
}
