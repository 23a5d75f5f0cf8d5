//go:build !linux

package workload

import "errors"

func sameNamespace(string) bool { return false }

func openPidfd(uint32) (int, bool, error) { return -1, true, errors.New("no pidfd on this system") }

func closePidfd(int) {}

func exitedPidfds(fds []int) []bool {
	out := make([]bool, len(fds))
	for i := range out {
		out[i] = true
	}
	return out
}
