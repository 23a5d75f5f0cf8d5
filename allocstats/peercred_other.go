//go:build !linux

package allocstats

import (
	"errors"
	"net"
)

// peerCredentials needs SO_PEERCRED, which only Linux has.
func peerCredentials(*net.UnixConn) (pid, uid uint32, err error) {
	return 0, 0, errors.New("peer credentials: SO_PEERCRED is only available on Linux")
}
