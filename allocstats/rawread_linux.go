package allocstats

import (
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawReader reads a Unix socket connection through its raw descriptor with
// read(2) made as a raw system call: a read on a non-blocking socket never
// blocks, and a raw call skips the runtime's system-call bookkeeping, which
// on an otherwise idle daemon wakes the runtime's monitor thread at every
// read (a futex wake and a thread switch for each message of an idle
// client). Waiting for data, deadlines and Close work as for net.Conn.Read:
// the runtime's poller still does them.
type rawReader struct {
	rc syscall.RawConn
}

// newConnReader returns what the connection's lines are read from.
func newConnReader(c net.Conn) io.Reader {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return rawReader{rc}
}

func (r rawReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n uintptr
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, _, errno = syscall.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if errno != syscall.EINTR {
				return errno != syscall.EAGAIN
			}
		}
	})
	switch {
	case err != nil: // the deadline passed, or the connection was closed
		return 0, err
	case errno != 0:
		return 0, &net.OpError{Op: "read", Net: "unix", Err: errno}
	case n == 0:
		return 0, io.EOF
	}
	return int(n), nil
}
