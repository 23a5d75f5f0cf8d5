package workload

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// sameNamespace reports whether the pids under procPath are this process's
// pids: pidfd_open(2) takes a pid of the caller's pid namespace, so a
// pidfd only names the process /proc/<pid> describes when procPath is a
// procfs of that namespace (/proc, or the host's /proc of a container run
// with the host's pid namespace). procPath's "self" names the reader in
// the procfs's own namespace.
func sameNamespace(procPath string) bool {
	self, err := os.Readlink(filepath.Join(procPath, "self"))
	return err == nil && self == strconv.Itoa(os.Getpid())
}

// openPidfd returns a pidfd of pid. unsupported is true when the kernel
// has no pidfd_open (before 5.3) or refuses it for a reason that would
// hold for any pid.
func openPidfd(pid uint32) (fd int, unsupported bool, err error) {
	fd, err = unix.PidfdOpen(int(pid), 0) // no flags: PIDFD_NONBLOCK needs 5.10, and it is only polled
	if err != nil {
		return -1, errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL), err
	}
	return fd, false, nil
}

func closePidfd(fd int) { unix.Close(fd) }

// exitedPidfds asks the kernel, in one poll(2) that does not wait, which
// of fds name a process that has exited (a pidfd reads as ready then). On
// an error every fd is reported: the caller reads /proc for each instead.
func exitedPidfds(fds []int) []bool {
	out := make([]bool, len(fds))
	if len(fds) == 0 {
		return out
	}
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	for {
		_, err := unix.Poll(pfds, 0)
		if err == nil {
			break
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		for i := range out {
			out[i] = true
		}
		return out
	}
	for i, p := range pfds {
		out[i] = p.Revents != 0 // POLLIN, or POLLERR/POLLHUP/POLLNVAL: read /proc
	}
	return out
}
