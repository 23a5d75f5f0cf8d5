package memtrim

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

const sample = `00400000-00411000 r--p 00000000 fd:00 1311 /usr/local/bin/gpumem_exporter
Size:                 68 kB
Rss:                  68 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
00411000-00f4a000 r-xp 00011000 fd:00 1311 /usr/local/bin/gpumem_exporter
Anonymous:             0 kB
01c7b000-01c7c000 r--p 0187a000 fd:00 1311 /usr/local/bin/gpumem_exporter
Anonymous:             4 kB
01c7c000-01d13000 rw-p 0187b000 fd:00 1311 /usr/local/bin/gpumem_exporter
Anonymous:           536 kB
01d13000-03d5e000 rw-p 00000000 00:00 0
Anonymous:           188 kB
7f00000000-7f00100000 rw-s 00000000 00:06 812 /dev/nvidiactl
7f00100000-7f00200000 r--p 00000000 00:06 813 /dev/nvidia0
7f00200000-7f00300000 r--s 00000000 00:01 99 /memfd:gpu (deleted)
7f00300000-7f00400000 r--p 00000000 00:01 98 /memfd:x (deleted)
7f85a881d000-7f85a8973000 r-xp 00028000 fd:00 2201 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f85a8a00000-7f85a8a10000 r--p 00000000 fd:00 3001 /opt/my lib/libfoo.so (deleted)
7ffd1000000-7ffd1021000 rw-p 00000000 00:00 0 [stack]
7ffd1100000-7ffd1102000 r--p 00000000 00:00 0 [vvar]
7ffd1102000-7ffd1104000 r-xp 00000000 00:00 0 [vdso]
`

func TestParseSmapsPicksReadOnlyFileMappings(t *testing.T) {
	regions, err := parseSmaps(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(regions) != 14 {
		t.Fatalf("%d mappings, want 14", len(regions))
	}
	var picked []string
	for _, r := range regions {
		if r.releasable() {
			picked = append(picked, r.path+" "+r.perms)
		}
	}
	want := []string{
		"/usr/local/bin/gpumem_exporter r--p",
		"/usr/local/bin/gpumem_exporter r-xp",
		"/usr/local/bin/gpumem_exporter r--p",
		"/usr/lib/x86_64-linux-gnu/libc.so.6 r-xp",
		"/opt/my lib/libfoo.so (deleted) r--p",
	}
	if strings.Join(picked, "\n") != strings.Join(want, "\n") {
		t.Errorf("picked\n%s\nwant\n%s", strings.Join(picked, "\n"), strings.Join(want, "\n"))
	}
	// The loader's relocated page (read-only, 4 kB private) is known as
	// such: Release must not drop it.
	if regions[2].anonymous != 4<<10 || regions[1].anonymous != 0 {
		t.Errorf("anonymous bytes %d, %d; want 4096, 0", regions[2].anonymous, regions[1].anonymous)
	}
	if regions[2].start != 0x01c7b000 || regions[2].end != 0x01c7c000 {
		t.Errorf("range %x-%x", regions[2].start, regions[2].end)
	}
}

func TestParseSmapsRejectsGarbage(t *testing.T) {
	for _, bad := range []string{
		"zz-01 r--p 0 fd:00 1 /x\n",
		"0400-0300 r--p 0 fd:00 1 /x\n",
		"0400-0500 r--p\n",
		"0400-0500 r--p 0 fd:00 1 /x\nAnonymous: lots kB\n",
	} {
		if _, err := parseSmaps(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// residentOf is the Rss, in bytes, of the mapping that starts at addr.
func residentOf(t *testing.T, addr uintptr) uint64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			lo, _, _ := strings.Cut(f[0], "-")
			start, err := strconv.ParseUint(lo, 16, 64)
			in = err == nil && uintptr(start) == addr
			continue
		}
		if in && len(f) >= 2 && f[0] == "Rss:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no mapping at %x", addr)
	return 0
}

// mapFile maps size bytes of the file at path read-only with flags; the
// caller unmaps it.
func mapFile(t *testing.T, path string, size, flags int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, flags)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// mapTouched maps size bytes of the file at path read-only and privately,
// as the loader maps a library's code, and reads every page of it, each
// of which must hold want.
func mapTouched(t *testing.T, path string, size int, want byte) []byte {
	t.Helper()
	m := mapFile(t, path, size, unix.MAP_PRIVATE)
	t.Cleanup(func() { unix.Munmap(m) })
	page := os.Getpagesize()
	sum := 0
	for i := 0; i < size; i += page {
		sum += int(m[i])
	}
	if sum != int(want)*(size/page) {
		t.Fatalf("read %d", sum)
	}
	return m
}

func TestReleaseDropsCleanFilePagesAndKeepsPrivateOnes(t *testing.T) {
	const size = 1 << 20
	page := os.Getpagesize()
	path := filepath.Join(t.TempDir(), "lib.so")
	if err := os.WriteFile(path, bytes.Repeat([]byte{'A'}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// A clean read-only mapping, every page touched: as a library's code.
	clean := mapTouched(t, path, size, 'A')
	// A read-only mapping with one page written before it was made
	// read-only: as the relocations the dynamic loader writes.
	relro, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(relro)
	copy(relro[:page], bytes.Repeat([]byte{'R'}, page))
	if err := unix.Mprotect(relro, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}

	cleanAddr := uintptr(unsafe.Pointer(&clean[0]))
	if got := residentOf(t, cleanAddr); got < size/2 {
		t.Fatalf("before Release %d bytes of the clean mapping resident, want most of %d", got, size)
	}
	res, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	if res.Regions < 3 || res.Before == 0 || res.After == 0 {
		t.Errorf("result %+v", res)
	}
	if res.NoPageout && kernelAtLeast(t, 5, 4) {
		t.Error("NoPageout on a kernel that has MADV_PAGEOUT")
	}
	if got := residentOf(t, cleanAddr); got != 0 {
		t.Errorf("after Release %d bytes of the clean mapping still resident, want 0", got)
	}
	// What was released reads back from the file; what the process wrote
	// is still there.
	if !bytes.Equal(clean, bytes.Repeat([]byte{'A'}, size)) {
		t.Error("the clean mapping reads differently after Release")
	}
	if !bytes.Equal(relro[:page], bytes.Repeat([]byte{'R'}, page)) {
		t.Error("Release dropped a page the process had written: a relocated library would now crash")
	}
	if !bytes.Equal(relro[page:], bytes.Repeat([]byte{'A'}, size-page)) {
		t.Error("the rest of the written mapping reads differently")
	}
}

func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatal(err)
	}
	return ma > major || ma == major && mi >= minor
}

func TestRSS(t *testing.T) {
	if r := rss(); r < 1<<20 {
		t.Errorf("rss %d bytes", r)
	}
}

// diskDir is a temporary directory on a filesystem with a page cache
// that fadvise can drop: tmpfs keeps its files in memory.
func diskDir(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{t.TempDir(), "."} {
		var fs unix.Statfs_t
		if unix.Statfs(dir, &fs) == nil && fs.Type != unix.TMPFS_MAGIC {
			if dir != "." {
				return dir
			}
			if d, err := os.MkdirTemp(".", "memtrim-test-"); err == nil {
				t.Cleanup(func() { os.RemoveAll(d) })
				return d
			}
		}
	}
	t.Skip("no disk filesystem to test on")
	return ""
}

// cached is how many pages of the file at path are in the page cache,
// as mincore sees them through a fresh mapping (the test owns the file,
// so the kernel reports the cache, not only this process's pages).
func cached(t *testing.T, path string, size int) int {
	t.Helper()
	m := mapFile(t, path, size, unix.MAP_SHARED)
	defer unix.Munmap(m)
	vec := make([]byte, (size+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// A process that may not write its binary gets no MADV_PAGEOUT from the
// kernel for it: the binary's pages must still leave the page cache, or
// they fault back in whole large folios at a time. The file stands for
// the binary here.
func TestReleaseDropsTheCacheWithoutPageout(t *testing.T) {
	const size = 4 << 20
	page := os.Getpagesize()
	path := filepath.Join(diskDir(t), "code.so")
	if err := os.WriteFile(path, bytes.Repeat([]byte{'C'}, size), 0o444); err != nil {
		t.Fatal(err)
	}
	// Written back, or the kernel keeps the dirty pages whatever it is asked.
	if f, err := os.Open(path); err != nil {
		t.Fatal(err)
	} else {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	m := mapTouched(t, path, size, 'C')
	if got := cached(t, path, size); got < size/page/2 {
		t.Fatalf("before Release %d pages of the file cached, want most of %d", got, size/page)
	}

	res, err := release(false, path)
	if err != nil {
		t.Fatal(err)
	}
	if !res.NoPageout || !res.BinaryUncached {
		t.Errorf("result %+v, want NoPageout and the file uncached", res)
	}
	if got := residentOf(t, uintptr(unsafe.Pointer(&m[0]))); got != 0 {
		t.Errorf("after Release %d bytes of the mapping resident, want 0", got)
	}
	if got := cached(t, path, size); got != 0 {
		t.Errorf("after Release %d pages of the file still cached, want 0", got)
	}
	if !bytes.Equal(m, bytes.Repeat([]byte{'C'}, size)) {
		t.Error("the mapping reads differently after Release")
	}
}
