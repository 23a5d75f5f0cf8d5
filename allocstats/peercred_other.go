//go:build !linux

package allocstats

import (
	"errors"
	"syscall"
	"time"
)

type kernelConn interface {
	SyscallConn() (syscall.RawConn, error)
}

type kernelPeerInfo struct {
	pid, uid uint32
	pidfd    *pidfd
}

// peerCredentials needs SO_PEERCRED, which only Linux has.
func peerCredentials(kernelConn) (kernelPeerInfo, error) {
	return kernelPeerInfo{}, errors.New("SO_PEERCRED is only available on Linux")
}

// kernelUID needs SO_PEERCRED too.
func kernelUID(kernelConn) (uint32, bool) { return 0, false }

type pidfd struct{}

func (*pidfd) alive() bool { return false }
func (*pidfd) close()      {}

func bootTime() time.Duration { return 0 }

// peerClosed would need poll's POLLRDHUP; elsewhere nothing queued by an
// exited process is taken.
func peerClosed(kernelConn) bool { return false }
