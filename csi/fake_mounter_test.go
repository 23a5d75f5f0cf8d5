package csi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// fakeMounter is a mount table in memory: it stands for the kernel, so two
// Drivers given the same fakeMounter see the same mounts (a plugin restart).
type fakeMounter struct {
	mu      sync.Mutex
	stacks  map[string][]fakeMount // target -> mounts, topmost last
	bindErr error                  // returned by BindReadOnly when set
	binds   int                    // successful BindReadOnly calls
}

type fakeMount struct {
	source   string
	readOnly bool
}

func newFakeMounter() *fakeMounter {
	return &fakeMounter{stacks: map[string][]fakeMount{}}
}

func (f *fakeMounter) BindReadOnly(source, target string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bindErr != nil {
		return f.bindErr
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() {
		return fmt.Errorf("bind-mounting %s at %s: target is not a directory (%v)", source, target, err)
	}
	if fi, err := os.Stat(source); err != nil || !fi.IsDir() {
		return fmt.Errorf("bind-mounting %s at %s: source is not a directory (%v)", source, target, err)
	}
	t := filepath.Clean(target)
	f.stacks[t] = append(f.stacks[t], fakeMount{source: filepath.Clean(source), readOnly: true})
	f.binds++
	return nil
}

func (f *fakeMounter) Unmount(target string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := filepath.Clean(target)
	s := f.stacks[t]
	if len(s) == 0 {
		return fmt.Errorf("unmounting %s: %w", target, errors.New("not mounted"))
	}
	if len(s) == 1 {
		delete(f.stacks, t)
	} else {
		f.stacks[t] = s[:len(s)-1]
	}
	return nil
}

func (f *fakeMounter) Check(target, source string) (MountState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stacks[filepath.Clean(target)]
	if len(s) == 0 {
		return MountState{}, nil
	}
	top := s[len(s)-1]
	return MountState{Mounted: true, OfSource: top.source == filepath.Clean(source), ReadOnly: top.readOnly}, nil
}

// preload puts a mount at target as if an earlier process had made it.
func (f *fakeMounter) preload(target string, m fakeMount) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := filepath.Clean(target)
	f.stacks[t] = append(f.stacks[t], m)
}

// depth is the number of mounts stacked at target.
func (f *fakeMounter) depth(target string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.stacks[filepath.Clean(target)])
}

// total is the number of mounts in the whole table.
func (f *fakeMounter) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.stacks {
		n += len(s)
	}
	return n
}
