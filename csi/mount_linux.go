//go:build linux

package csi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// NewMounter returns the Mounter that calls mount(2) and umount(2) and
// reads /proc/self/mountinfo. It needs CAP_SYS_ADMIN.
func NewMounter() Mounter { return kernelMounter{mountInfo: "/proc/self/mountinfo"} }

type kernelMounter struct{ mountInfo string }

// Flags of the second step of BindReadOnly. A bind mount ignores every flag
// but MS_BIND|MS_REC on creation, so the restrictions take a remount.
const readOnlyRemountFlags = unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

func (m kernelMounter) BindReadOnly(source, target string) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s at %s: %w", source, target, err)
	}
	if err := unix.Mount("", target, "", readOnlyRemountFlags, ""); err != nil {
		// Never leave a writable bind behind.
		if uerr := unix.Unmount(target, 0); uerr != nil {
			return fmt.Errorf("making the bind at %s read-only: %w (and undoing the bind: %v)", target, err, uerr)
		}
		return fmt.Errorf("making the bind at %s read-only: %w", target, err)
	}
	return nil
}

func (m kernelMounter) Unmount(target string) error {
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		// A process still holds something open below the target (a client
		// connected to the socket). The mount is read-only, so a lazy
		// detach loses nothing: it goes once the last user closes.
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmounting %s: %w", target, err)
	}
	return nil
}

func (m kernelMounter) Check(target, source string) (MountState, error) {
	t, err := filepath.EvalSymlinks(target)
	if errors.Is(err, os.ErrNotExist) {
		return MountState{}, nil
	}
	if err != nil {
		return MountState{}, fmt.Errorf("resolving %s: %w", target, err)
	}
	s, err := filepath.EvalSymlinks(source)
	if err != nil {
		return MountState{}, fmt.Errorf("resolving %s: %w", source, err)
	}
	f, err := os.Open(m.mountInfo)
	if err != nil {
		return MountState{}, fmt.Errorf("reading the mount table: %w", err)
	}
	defer f.Close()
	entries, err := parseMountInfo(f)
	if err != nil {
		return MountState{}, err
	}
	return checkMounts(entries, t, s), nil
}

// exchange swaps two paths atomically (renameat2 RENAME_EXCHANGE, Linux
// 3.15+ on most local filesystems, tmpfs included).
func exchange(a, b string) error {
	return unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
}
