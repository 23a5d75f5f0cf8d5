package main

import (
	"fmt"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem_exporter/workload"
)

// fdReserve is what the daemon needs beside its connection caps: the
// listening sockets, NVML's device files, /proc reads, the Kubernetes
// client's connections, the log.
const fdReserve = 128

// healthMaxConnections caps the --web.health-address listener.
const healthMaxConnections = 8

// fitFileLimit raises the soft RLIMIT_NOFILE to the hard limit (Go does it
// at start too; this makes it explicit and logged) and checks that the
// connection caps fit under it with fdReserve to spare: each socket
// connection costs two descriptors (the connection and its peer's pidfd),
// each HTTP connection one. When they do not fit, it lowers
// --allocstats.max-connections (and the per-uid cap with it), so that an
// HTTP flood can never take the descriptors the socket needs, nor the
// reverse. What is left, up to workload.MaxPidfds, is the process
// resolver's: a pidfd per GPU process it watches.
func fitFileLimit(o *options, logger log.Logger) error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		level.Warn(logger).Log("msg", "cannot read the open file limit; connection caps not checked against it", "err", err)
		return nil
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err == nil {
			lim = raised
		}
	}
	before := o.maxConnections
	if err := fitConnections(lim.Cur, o); err != nil {
		return err
	}
	kv := []any{"open_file_limit", lim.Cur, "allocstats_max_connections", o.maxConnections,
		"web_max_connections", o.webMaxConnections * webListeners(o), "reserve", fdReserve, "process_pidfds", o.pidfds}
	if o.maxConnections < before {
		level.Warn(logger).Log(append([]any{"msg", "Lowered --allocstats.max-connections to fit the open file limit (raise it with ulimit -n or LimitNOFILE=)", "asked", before}, kv...)...)
		return nil
	}
	level.Info(logger).Log(append([]any{"msg", "File descriptor budget"}, kv...)...)
	return nil
}

func webListeners(o *options) int {
	if o.webConfig == nil || o.webConfig.WebListenAddresses == nil {
		return 1
	}
	return max(1, len(*o.webConfig.WebListenAddresses))
}

// fitConnections lowers o.maxConnections (and o.maxConnectionsPerUID) so
// that 2 per socket connection, the HTTP caps and fdReserve fit in limit,
// and gives what is left, up to workload.MaxPidfds, to o.pidfds.
func fitConnections(limit uint64, o *options) error {
	web := uint64(o.webMaxConnections * webListeners(o))
	if o.healthAddress != "" {
		web += healthMaxConnections
	}
	need := 2*uint64(o.maxConnections) + web + fdReserve
	if need <= limit {
		o.pidfds = int(min(limit-need, workload.MaxPidfds))
		return nil
	}
	const least = 16
	if limit < web+fdReserve+2*least {
		return fmt.Errorf("the open file limit (%d) is too low for --web.max-connections=%d and at least %d socket connections; raise it (ulimit -n, LimitNOFILE=) to at least %d",
			limit, o.webMaxConnections, least, web+fdReserve+2*least)
	}
	o.maxConnections = int((limit - web - fdReserve) / 2)
	o.maxConnectionsPerUID = min(o.maxConnectionsPerUID, o.maxConnections)
	o.pidfds = 0 // none to spare: processes are checked through /proc
	return nil
}
