package csi

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"strings"
)

// mountEntry is one line of /proc/<pid>/mountinfo (proc(5)), the fields the
// node service needs.
type mountEntry struct {
	device     string // major:minor of the filesystem
	root       string // the directory of that filesystem shown at mountPoint
	mountPoint string
	readOnly   bool // per-mount option ro
}

// parseMountInfo reads mountinfo lines in the kernel's order (a mount
// stacked on top of another at the same point comes later).
func parseMountInfo(r io.Reader) ([]mountEntry, error) {
	var entries []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		// id parent major:minor root mount-point options [optional...] - fstype source super-options
		f := strings.Fields(line)
		if len(f) < 7 {
			return nil, fmt.Errorf("mountinfo line %d: %d fields, want at least 7: %q", n, len(f), line)
		}
		e := mountEntry{
			device:     f[2],
			root:       unescapeMountPath(f[3]),
			mountPoint: unescapeMountPath(f[4]),
		}
		for _, opt := range strings.Split(f[5], ",") {
			if opt == "ro" {
				e.readOnly = true
			}
		}
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return entries, nil
}

// unescapeMountPath undoes the kernel's octal escapes of space, tab,
// newline and backslash (\040, \011, \012, \134) in mountinfo paths.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// topmostAt returns the last (topmost) entry mounted exactly at p.
func topmostAt(entries []mountEntry, p string) (mountEntry, bool) {
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].mountPoint == p {
			return entries[i], true
		}
	}
	return mountEntry{}, false
}

// locate returns the filesystem (device) and the directory within it that
// the absolute, symlink-free path p shows: the topmost mount whose mount
// point is the longest prefix of p, and p's remainder below it.
func locate(entries []mountEntry, p string) (device, root string, ok bool) {
	best := -1
	for i, e := range entries {
		if !pathWithin(p, e.mountPoint) {
			continue
		}
		if best < 0 || len(e.mountPoint) >= len(entries[best].mountPoint) {
			best = i
		}
	}
	if best < 0 {
		return "", "", false
	}
	e := entries[best]
	rest := strings.TrimPrefix(p, e.mountPoint)
	return e.device, path.Join(e.root, rest), true
}

// pathWithin reports whether p is dir or below it (whole components).
func pathWithin(p, dir string) bool {
	if dir == "/" || p == dir {
		return true
	}
	return strings.HasPrefix(p, dir+"/")
}

// checkMounts is Check over a parsed table, with target and source already
// absolute and free of symlinks.
func checkMounts(entries []mountEntry, target, source string) MountState {
	top, ok := topmostAt(entries, target)
	if !ok {
		return MountState{}
	}
	st := MountState{Mounted: true, ReadOnly: top.readOnly}
	// The target's own mount covers it, so look the source up in the table
	// as it would be without mounts at or below the target.
	var others []mountEntry
	for _, e := range entries {
		if !pathWithin(e.mountPoint, target) {
			others = append(others, e)
		}
	}
	if dev, root, found := locate(others, source); found {
		st.OfSource = dev == top.device && root == top.root
	}
	return st
}
