package memtrim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// region is one mapping of /proc/self/smaps.
type region struct {
	start, end uint64
	perms      string
	inode      string
	path       string
	// anonymous is the bytes of the mapping held privately (copy on
	// write): smaps' "Anonymous:" line.
	anonymous uint64
}

// releasable reports whether r maps a regular file read-only and
// privately: the binary's code and constants and the shared libraries'.
// Writable mappings (data, heap), shared ones, anonymous ones, devices
// (NVML maps /dev/nvidia*) and memfds are never advised.
func (r region) releasable() bool {
	return len(r.perms) == 4 && r.perms[0] == 'r' && r.perms[1] == '-' && r.perms[3] == 'p' &&
		r.inode != "0" && strings.HasPrefix(r.path, "/") &&
		!strings.HasPrefix(r.path, "/dev/") && !strings.HasPrefix(r.path, "/memfd:")
}

// parseSmaps reads the mappings of an smaps file.
func parseSmaps(rd io.Reader) ([]region, error) {
	var out []region
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok && !strings.HasSuffix(fields[0], ":") {
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil || end <= start || len(fields) < 5 {
				return nil, fmt.Errorf("smaps: cannot read mapping %q", line)
			}
			r := region{start: start, end: end, perms: fields[1], inode: fields[4]}
			if len(fields) > 5 {
				// A path may hold spaces; " (deleted)" stays on it.
				r.path = strings.Join(fields[5:], " ")
			}
			out = append(out, r)
			continue
		}
		if fields[0] == "Anonymous:" && len(out) > 0 && len(fields) >= 2 {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("smaps: cannot read %q", line)
			}
			out[len(out)-1].anonymous = kb << 10
		}
	}
	return out, sc.Err()
}

func madvise(r region, advice int) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(r.start), uintptr(r.end-r.start), uintptr(advice)); e != 0 {
		return e
	}
	return nil
}

// Release drops from memory the pages of the read-only file mappings
// (the binary and its shared libraries) and the free heap, as the
// package comment says. Call it once, when start-up is over. It needs
// Linux 5.4 (MADV_PAGEOUT) for the first way below; on an older kernel
// the second still works, and Result.NoPageout says so.
//
// Per mapping, advice only:
//   - MADV_RANDOM: a page faulted in later is read alone, without
//     read-ahead around it.
//   - MADV_PAGEOUT: the kernel reclaims the mapping's pages that no other
//     process maps, dropping clean file pages from the page cache and
//     writing private ones to swap (or keeping them). The kernel does this
//     to file pages only for a process that may write the file (its owner,
//     root, or where its permissions allow); otherwise it skips them.
//   - MADV_DONTNEED, only on mappings that hold no private page: the
//     process unmaps the pages that are still mapped (those PAGEOUT
//     skipped).
//
// Then POSIX_FADV_DONTNEED on the binary: the kernel drops its clean
// cached pages that no process maps (any longer). That is the same end by
// a way any user that may read the file has, so the binary's pages go even
// where the kernel skipped PAGEOUT; without it, its unmapped pages stay
// cached in large folios and fault back in a folio at a time. The shared
// libraries are left to PAGEOUT: their cached pages serve the node's other
// processes (libcuda's the training jobs'). Finally the Go heap's free
// pages go back to the kernel (debug.FreeOSMemory).
func Release() (Result, error) {
	return release(true, "/proc/self/exe")
}

// release is Release. pageout false leaves MADV_PAGEOUT out, as a kernel
// does for a file the process may not write (the tests' way to be that
// process); binary is the file whose cache is dropped.
func release(pageout bool, binary string) (Result, error) {
	var res Result
	res.Before = rss()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return res, err
	}
	regions, err := parseSmaps(f)
	f.Close()
	if err != nil {
		return res, err
	}
	refused := 0
	for _, r := range regions {
		if !r.releasable() {
			continue
		}
		res.Regions++
		// Errors are per mapping (a locked one refuses) and change nothing
		// the process relies on: the next mapping is still worth trying.
		_ = madvise(r, unix.MADV_RANDOM)
		if pageout {
			if err := madvise(r, unix.MADV_PAGEOUT); errors.Is(err, unix.EINVAL) {
				refused++
			}
		}
		if r.anonymous == 0 {
			_ = madvise(r, unix.MADV_DONTNEED)
		}
	}
	res.BinaryUncached = dropCached(binary)
	debug.FreeOSMemory()
	res.After = rss()
	// A kernel without MADV_PAGEOUT refuses it everywhere; one mapping
	// that refuses (a locked one) is no news.
	res.NoPageout = !pageout || res.Regions > 0 && refused == res.Regions
	if res.Regions == 0 {
		return res, errors.New("no read-only file mapping found in /proc/self/smaps")
	}
	return res, nil
}

// dropCached asks the kernel to drop the cached pages of the file at
// path that no process maps (POSIX_FADV_DONTNEED), and says whether it
// could: not where this process may not read the file, nor for anything
// but a regular file. The kernel never drops a dirty or mapped page so.
func dropCached(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	return unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED) == nil
}

// rss is VmRSS of /proc/self/status in bytes, 0 where unknown.
func rss() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			kb, _ := strconv.ParseUint(f[0], 10, 64)
			return kb << 10
		}
	}
	return 0
}
