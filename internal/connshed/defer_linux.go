//go:build linux

package connshed

import (
	"syscall"

	"golang.org/x/sys/unix"
)

func deferAccept(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, deferAcceptSeconds)
	}); cerr != nil {
		return cerr
	}
	return err
}
