// Package allocstats receives allocator statistics pushed by instrumented
// processes (PyTorch, JAX, CuPy, …) over a Unix stream socket, keeps the
// latest state per process and device in a Store, and records
// out-of-memory events: the Store hands each to its observers
// (OOMObserver, the OOM reports) with the connection to answer (Replier).
//
// The wire protocol is specified in docs/protocol.md: one JSON object per
// line, identity taken from SO_PEERCRED, never from the message. The data
// flow is socket -> Server -> Session -> Store -> attribution: the Server
// opens a Session per connection, the store's one input, which the
// simulated node's processes use too; the one join (attribution) reads
// the Store with Processes, which returns a deep copy, and every output
// reads the join. Ingest never makes a
// reader wait: readers take a copy-on-write index of the processes and
// lock one process at a time, and a connection's messages lock only its
// own process (see Store).
//
// The lines are decoded by package wire. Hello, DeviceReport, OOMMessage
// and Optional here are its types, for the packages that hand reports to
// a Session.
package allocstats

import (
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
)

// Defaults of the server and store settings, stated here only: the
// daemon's flags take their defaults from these, and Config (NewServer),
// NewStore and SetProcessLimits apply them to settings left zero.
const (
	DefaultSocketPath      = wire.DefaultSocketDir + "/" + wire.SocketName
	DefaultSocketMode      = 0o666
	DefaultMaxMessageBytes = 64 << 10
	DefaultMaxConnections  = 1024
	DefaultMaxDevices      = 64
	DefaultIdleTimeout     = 5 * time.Minute
	defaultInterval        = time.Second
	DefaultTTL             = 2 * time.Minute

	// DefaultMaxConnectionsPerUID bounds the connections of one uid, so
	// that one user cannot take every slot.
	DefaultMaxConnectionsPerUID = 64
	// DefaultMaxProcesses and DefaultMaxProcessesPerUID bound the
	// reporting processes the store keeps.
	DefaultMaxProcesses       = 1024
	DefaultMaxProcessesPerUID = 64
	// DefaultMaxBufferedBytes bounds the memory all connections together
	// hold in unfinished lines.
	DefaultMaxBufferedBytes = 4 << 20
	// DefaultUnlistedGrace is how long a process's state on a device where
	// NVML does not list it is kept.
	DefaultUnlistedGrace = 30 * time.Second
	// DefaultOOMLinger is how long the counters of a process that exited
	// are still exported, so that a scrape sees their last values (an OOM
	// raised just before the process exited).
	DefaultOOMLinger = time.Minute
)
