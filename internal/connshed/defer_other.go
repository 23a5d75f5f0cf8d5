//go:build !linux

package connshed

import "syscall"

// deferAccept: only Linux has TCP_DEFER_ACCEPT.
func deferAccept(_, _ string, _ syscall.RawConn) error { return nil }
