// Package allocstats receives allocator statistics pushed by instrumented
// processes (PyTorch, JAX, CuPy, …) over a Unix stream socket, keeps the
// latest state per process and device in a Store, and records out-of-memory
// reports.
//
// The wire protocol is specified in docs/protocol.md: one JSON object per
// line, identity taken from SO_PEERCRED, never from the message. The data
// flow is socket -> Server -> Store -> collector; the collector reads the
// Store with Processes, which returns a deep copy.
package allocstats

import "time"

// Defaults of the server and store settings, for flag definitions.
const (
	DefaultSocketPath      = "/run/gpumem/allocstats.sock"
	DefaultSocketMode      = 0o666
	DefaultMaxMessageBytes = 64 << 10
	DefaultMaxConnections  = 1024
	DefaultMaxDevices      = 64
	DefaultIdleTimeout     = 5 * time.Minute
	DefaultInterval        = time.Second
	DefaultTTL             = 2 * time.Minute
)
