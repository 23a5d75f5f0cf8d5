package allocstats

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"golang.org/x/sys/unix"
)

// maxSocketPathLen is the longest path a Unix socket address holds
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPathLen = 107

// resolveSocketPath decides where the socket goes. explicit says the user
// gave path: its directory must then exist and be writable (it is never
// created: a typo must not make a directory nobody watches). Otherwise
// (path is the default, or empty) the directory is created (0755) if
// needed, and when that fails, as for a user without root, it falls back to
// <xdgRuntimeDir>/gpumem/allocstats.sock, then to
// <tmpDir>/gpumem-<uid>/allocstats.sock (the daemon passes
// $XDG_RUNTIME_DIR, os.TempDir() and its uid). A fallback directory must be
// a real directory owned by the daemon's uid that no other user can write
// to, or another user could own the socket's directory. The caller should
// log the result.
func resolveSocketPath(explicit bool, path, xdgRuntimeDir, tmpDir string, uid int) (string, error) {
	if path == "" {
		path, explicit = DefaultSocketPath, false
	}
	if explicit {
		if err := checkSocketDir(path, dirPolicy{owner: -1}); err != nil {
			return "", fmt.Errorf("cannot use allocstats socket %s: %w", path, err)
		}
		return path, nil
	}
	err := checkSocketDir(path, dirPolicy{create: 0o755, owner: -1})
	if err == nil {
		return path, nil
	}
	errs := []error{err}
	if xdgRuntimeDir != "" && filepath.IsAbs(xdgRuntimeDir) {
		p := filepath.Join(xdgRuntimeDir, "gpumem", wire.SocketName)
		err := checkSocketDir(p, dirPolicy{create: 0o700, owner: uid})
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
	}
	p := filepath.Join(tmpDir, fmt.Sprintf("gpumem-%d", uid), wire.SocketName)
	if err := checkSocketDir(p, dirPolicy{create: 0o755, owner: uid}); err != nil {
		errs = append(errs, err)
		return "", fmt.Errorf("no usable directory for the allocstats socket: %w", errors.Join(errs...))
	}
	return p, nil
}

// dirPolicy says how checkSocketDir treats the socket's directory.
type dirPolicy struct {
	// create, when not 0, is the mode of the directory (and missing
	// parents) created when it does not exist.
	create os.FileMode
	// owner >= 0: the directory must be no symbolic link, belong to that
	// uid, and be writable by no one else.
	owner int
}

// checkSocketDir checks that a socket can be created at path: the path is
// short enough and its directory exists (see dirPolicy), is a directory and
// is writable.
func checkSocketDir(path string, pol dirPolicy) error {
	if len(path) > maxSocketPathLen {
		return fmt.Errorf("socket path %s is %d bytes, longer than the %d a Unix socket allows", path, len(path), maxSocketPathLen)
	}
	dir := filepath.Dir(path)
	if pol.create != 0 {
		if err := os.MkdirAll(dir, pol.create); err != nil {
			return fmt.Errorf("creating directory: %w", err)
		}
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("directory %s does not exist (it is not created for a path given explicitly)", dir)
	}
	if err != nil {
		return fmt.Errorf("checking directory: %w", err)
	}
	if pol.owner >= 0 {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || !ok || int(st.Uid) != pol.owner {
			return fmt.Errorf("%s is not a directory owned by uid %d", dir, pol.owner)
		}
		if fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("%s is writable by other users (mode %#o)", dir, fi.Mode().Perm())
		}
	} else if fi.Mode().Type() == fs.ModeSymlink {
		if fi, err = os.Stat(dir); err != nil {
			return fmt.Errorf("checking directory: %w", err)
		}
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("directory %s is not writable: %w", dir, err)
	}
	return nil
}

// socketFile is the socket file a server created: the path and the inode
// that stood there, so that the server unlinks only its own file and
// notices when it vanished or was replaced.
type socketFile struct {
	path     string
	dev, ino uint64
}

func statSocketFile(path string) (socketFile, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return socketFile{}, err
	}
	return socketFile{path: path, dev: uint64(st.Dev), ino: st.Ino}, nil
}

// inPlace reports whether the file at the path is still the one created.
func (f socketFile) inPlace() bool {
	now, err := statSocketFile(f.path)
	return err == nil && now == f
}

// remove unlinks the path if it is still the file created: never another
// daemon's socket that took its place.
func (f socketFile) remove() {
	if f.path != "" && f.inPlace() {
		os.Remove(f.path)
	}
}

// listenUnix creates the socket at path, whose directory was checked by
// resolveSocketPath, with the given mode, replacing the stale socket file
// of a dead daemon. The listener does not unlink the file on Close: the
// caller removes it with socketFile.remove.
func listenUnix(path string, mode os.FileMode) (*net.UnixListener, socketFile, error) {
	if err := checkSocketDir(path, dirPolicy{owner: -1}); err != nil {
		return nil, socketFile{}, fmt.Errorf("cannot use allocstats socket %s: %w", path, err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, socketFile{}, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, socketFile{}, fmt.Errorf("listening on allocstats socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	sock, err := statSocketFile(path)
	if err == nil {
		err = os.Chmod(path, mode)
	}
	if err != nil {
		l.Close()
		sock.remove()
		return nil, socketFile{}, fmt.Errorf("setting the mode of allocstats socket: %w", err)
	}
	return l, sock, nil
}

// removeStaleSocket removes path if it is a socket nobody listens on. It
// fails if a daemon answers there, or if path is something else than a
// socket (which it never removes).
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking allocstats socket: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket; not removing it", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("another daemon is listening on %s", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("checking whether a daemon listens on %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("removing stale allocstats socket: %w", err)
	}
	return nil
}
