//go:build pprof

package main

import (
	"net/http"
	"net/http/pprof"
)

// Built with -tags pprof (for profiling on a real node, never in a
// release), the exporter also serves Go's profiles and execution traces
// under /debug/pprof/ (scripts/gpu/profile.sh reads them).
func init() {
	debugHandlers = func(mux *http.ServeMux) {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
}
