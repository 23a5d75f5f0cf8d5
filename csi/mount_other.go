//go:build !linux

package csi

import "errors"

// NewMounter returns a Mounter that fails: bind mounts are Linux-only.
func NewMounter() Mounter { return unsupportedMounter{} }

type unsupportedMounter struct{}

var errUnsupported = errors.New("bind mounts are only supported on Linux")

func (unsupportedMounter) BindReadOnly(string, string) error { return errUnsupported }
func (unsupportedMounter) Unmount(string) error              { return errUnsupported }
func (unsupportedMounter) Check(string, string) (MountState, error) {
	return MountState{}, errUnsupported
}

func exchange(string, string) error { return errUnsupported }
