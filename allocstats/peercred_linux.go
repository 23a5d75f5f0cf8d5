//go:build linux

package allocstats

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peerCredentials returns the pid and uid of the process at the other end
// of c, as the kernel recorded them when it connected (SO_PEERCRED). The
// pid is in the daemon's PID namespace; 0 means the peer is outside it.
func peerCredentials(c *net.UnixConn) (pid, uid uint32, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return 0, 0, fmt.Errorf("peer credentials: getsockopt SO_PEERCRED: %w", credErr)
	}
	if cred.Pid <= 0 {
		return 0, 0, errors.New("peer credentials: the peer's pid is not visible in the daemon's PID namespace (run the daemon with the host PID namespace)")
	}
	return uint32(cred.Pid), cred.Uid, nil
}
