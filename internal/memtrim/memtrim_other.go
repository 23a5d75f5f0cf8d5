//go:build !linux

package memtrim

import "errors"

// Release is Linux only.
func Release() (Result, error) {
	return Result{}, errors.ErrUnsupported
}
