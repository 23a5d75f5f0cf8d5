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

	"golang.org/x/sys/unix"
)

// maxSocketPathLen is the longest path a Unix socket address holds
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPathLen = 107

// socketFileName is the socket's name in the fallback directories.
const socketFileName = "allocstats.sock"

// ResolveSocketPath decides where the socket goes and creates its
// directory (0755). explicit says the user gave path: if its directory
// cannot be created or written, that is an error. Otherwise (path is the
// default, or empty) and /run/gpumem is not usable, as for a user without
// root, it falls back to $XDG_RUNTIME_DIR/gpumem/allocstats.sock, then to
// <os.TempDir()>/gpumem-<uid>/allocstats.sock (a directory that must be
// owned by the user). The caller should log the result.
func ResolveSocketPath(explicit bool, path string) (string, error) {
	return resolveSocketPath(explicit, path, os.Getenv("XDG_RUNTIME_DIR"), os.TempDir(), os.Getuid())
}

func resolveSocketPath(explicit bool, path, xdgRuntimeDir, tmpDir string, uid int) (string, error) {
	if path == "" {
		path, explicit = DefaultSocketPath, false
	}
	err := prepareSocketDir(path, -1)
	if err == nil {
		return path, nil
	}
	if explicit {
		return "", fmt.Errorf("cannot use allocstats socket %s: %w", path, err)
	}
	errs := []error{err}
	if xdgRuntimeDir != "" && filepath.IsAbs(xdgRuntimeDir) {
		p := filepath.Join(xdgRuntimeDir, "gpumem", socketFileName)
		err := prepareSocketDir(p, -1)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
	}
	// In a shared, sticky temporary directory the directory must be ours,
	// or another user could own the socket's directory.
	p := filepath.Join(tmpDir, fmt.Sprintf("gpumem-%d", uid), socketFileName)
	if err := prepareSocketDir(p, uid); err != nil {
		errs = append(errs, err)
		return "", fmt.Errorf("no usable directory for the allocstats socket: %w", errors.Join(errs...))
	}
	return p, nil
}

// prepareSocketDir checks that a socket can be created at path: the path is
// short enough and its directory exists (created 0755 if needed), is a
// directory and is writable. With owner >= 0 the directory must also be no
// symbolic link and belong to that uid.
func prepareSocketDir(path string, owner int) error {
	if len(path) > maxSocketPathLen {
		return fmt.Errorf("socket path %s is %d bytes, longer than the %d a Unix socket allows", path, len(path), maxSocketPathLen)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("checking directory: %w", err)
	}
	if owner >= 0 {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || !ok || int(st.Uid) != owner {
			return fmt.Errorf("%s is not a directory owned by uid %d", dir, owner)
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

// listenUnix creates the socket at path with the given mode, replacing the
// stale socket file of a dead daemon.
func listenUnix(path string, mode os.FileMode) (*net.UnixListener, error) {
	if err := prepareSocketDir(path, -1); err != nil {
		return nil, fmt.Errorf("cannot use allocstats socket %s: %w", path, err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on allocstats socket: %w", err)
	}
	// Close removes the socket file.
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("setting the mode of allocstats socket: %w", err)
	}
	return l, nil
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
