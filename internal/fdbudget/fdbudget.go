// Package fdbudget shares the open file limit among the daemon's
// connection caps, so that an HTTP flood can never take the descriptors
// the allocator socket needs, nor the reverse.
package fdbudget

import (
	"fmt"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"golang.org/x/sys/unix"
)

// Reserve is what the daemon needs beside its connection caps: the
// listening sockets, NVML's device files, /proc reads, the Kubernetes
// client's connections, the log.
const Reserve = 128

// HealthMaxConnections caps the --web.health-address listener.
const HealthMaxConnections = 8

// Caps are what share the open file limit.
type Caps struct {
	// SocketConnections and SocketConnectionsPerUID are the allocator
	// socket's caps (--allocstats.max-connections and its per-uid cap).
	// Each socket connection costs two descriptors: the connection and its
	// peer's pidfd.
	SocketConnections, SocketConnectionsPerUID int
	// WebConnections is the cap of each of WebListeners HTTP listeners
	// (--web.max-connections), one descriptor a connection.
	WebConnections, WebListeners int
	// HealthConnections is the health listener's cap; 0 without one.
	HealthConnections int
	// MaxPidfds bounds Pidfds.
	MaxPidfds int
	// Pidfds is set by Fit: what the rest leaves, up to MaxPidfds, for the
	// process resolver (a pidfd per GPU process it watches).
	Pidfds int
}

// Fit raises the soft RLIMIT_NOFILE to the hard limit (Go does it at start
// too; this makes it explicit and logged) and fits c under it with Reserve
// to spare. When the caps do not fit, it lowers the socket's (the per-uid
// cap with it), and logs that --allocstats.max-connections was lowered.
func Fit(c Caps, logger log.Logger) (Caps, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		level.Warn(logger).Log("msg", "cannot read the open file limit; connection caps not checked against it", "err", err)
		return c, nil
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err == nil {
			lim = raised
		}
	}
	fitted, err := fit(lim.Cur, c)
	if err != nil {
		return c, err
	}
	kv := []any{"open_file_limit", lim.Cur, "allocstats_max_connections", fitted.SocketConnections,
		"web_max_connections", c.WebConnections * max(1, c.WebListeners), "reserve", Reserve, "process_pidfds", fitted.Pidfds}
	if fitted.SocketConnections < c.SocketConnections {
		level.Warn(logger).Log(append([]any{"msg", "Lowered --allocstats.max-connections to fit the open file limit (raise it with ulimit -n or LimitNOFILE=)", "asked", c.SocketConnections}, kv...)...)
		return fitted, nil
	}
	level.Info(logger).Log(append([]any{"msg", "File descriptor budget"}, kv...)...)
	return fitted, nil
}

// fit lowers the socket's caps so that 2 per socket connection, the HTTP
// caps and Reserve fit in limit, and gives what is left, up to MaxPidfds,
// to Pidfds.
func fit(limit uint64, c Caps) (Caps, error) {
	web := uint64(c.WebConnections*max(1, c.WebListeners) + c.HealthConnections)
	need := 2*uint64(c.SocketConnections) + web + Reserve
	if need <= limit {
		c.Pidfds = int(min(limit-need, uint64(c.MaxPidfds)))
		return c, nil
	}
	const least = 16
	if limit < web+Reserve+2*least {
		return c, fmt.Errorf("the open file limit (%d) is too low for --web.max-connections=%d and at least %d socket connections; raise it (ulimit -n, LimitNOFILE=) to at least %d",
			limit, c.WebConnections, least, web+Reserve+2*least)
	}
	c.SocketConnections = int((limit - web - Reserve) / 2)
	c.SocketConnectionsPerUID = min(c.SocketConnectionsPerUID, c.SocketConnections)
	c.Pidfds = 0 // none to spare: processes are checked through /proc
	return c, nil
}
