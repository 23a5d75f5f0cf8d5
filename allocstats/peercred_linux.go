//go:build linux

package allocstats

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// kernelConn is the part of *net.UnixConn that peer credentials need.
type kernelConn interface {
	SyscallConn() (syscall.RawConn, error)
}

// kernelPeerInfo is what the kernel recorded about a connection's peer
// when it connected.
type kernelPeerInfo struct {
	pid, uid uint32
	pidfd    *pidfd // nil where the kernel has no SO_PEERPIDFD
}

// peerCredentials returns the pid and uid of the process at the other end
// of c, as the kernel recorded them when it connected (SO_PEERCRED; the uid
// is the effective one), and a pidfd of that process (SO_PEERPIDFD) where
// the kernel has it. The pid is in the daemon's PID namespace; 0 means the
// peer is outside it.
func peerCredentials(c kernelConn) (kernelPeerInfo, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return kernelPeerInfo{}, err
	}
	var cred *unix.Ucred
	var credErr, fdErr error
	fd := -1
	if err := raw.Control(func(s uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(s), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if credErr == nil {
			fd, fdErr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
		}
	}); err != nil {
		return kernelPeerInfo{}, err
	}
	if credErr != nil {
		return kernelPeerInfo{}, fmt.Errorf("getsockopt SO_PEERCRED: %w", credErr)
	}
	if cred.Pid <= 0 {
		if fdErr == nil {
			unix.Close(fd)
		}
		return kernelPeerInfo{}, errors.New("the peer's pid is not visible in the daemon's PID namespace (run the daemon with the host PID namespace)")
	}
	kp := kernelPeerInfo{pid: uint32(cred.Pid), uid: cred.Uid}
	switch {
	case fdErr == nil:
		kp.pidfd = &pidfd{fd: fd}
	case errors.Is(fdErr, unix.ESRCH):
		// Kernels before 6.16 give no pidfd of a peer that was reaped.
		return kernelPeerInfo{}, fmt.Errorf("%w: pid %d exited before it could be identified", errPeerGone, cred.Pid)
	}
	// ENOPROTOOPT and the like: a kernel before 6.5, no pidfd.
	return kp, nil
}

// pidfd is a process file descriptor: it names one process for as long as
// it is open, whatever later happens to the pid number.
type pidfd struct {
	fd int
}

// alive reports whether the process still exists (a zombie counts: its pid
// is not free for reuse until it is reaped). pidfd_send_signal with signal
// 0 never blocks: it is made as a raw system call (see rawReader).
func (p *pidfd) alive() bool {
	_, _, errno := unix.RawSyscall6(unix.SYS_PIDFD_SEND_SIGNAL, uintptr(p.fd), 0, 0, 0, 0, 0)
	// EPERM: it exists, but a daemon without root may not signal it.
	return errno == 0 || errno == unix.EPERM
}

func (p *pidfd) close() { unix.Close(p.fd) }

// peerClosed reports whether nobody can write on c any more: every holder
// of its other end closed it, or shut it down for writing. What is still
// queued on c is then all there will ever be.
func peerClosed(c kernelConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	raw.Control(func(s uintptr) {
		fds := []unix.PollFd{{Fd: int32(s), Events: unix.POLLRDHUP}}
		for {
			n, err := unix.Poll(fds, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			closed = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) != 0
			return
		}
	})
	return closed
}

// bootTime returns CLOCK_BOOTTIME, the clock of /proc's start times.
func bootTime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// kernelUID returns the uid the kernel recorded for the peer of c
// (SO_PEERCRED), without the pidfd that peerCredentials also takes.
func kernelUID(c kernelConn) (uint32, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(s uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(s), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return 0, false
	}
	return cred.Uid, true
}
