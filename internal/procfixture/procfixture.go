// Package procfixture writes fake /proc trees for tests of code that reads
// /proc/<pid>/{stat,comm,status,cgroup}.
package procfixture

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Process is what a fake /proc/<pid> says.
type Process struct {
	Comm   string
	Start  uint64 // field 22 of stat
	UID    string
	Cgroup string
}

// StatLine is /proc/<pid>/stat as Linux writes it, with the start time as
// field 22.
func StatLine(pid uint32, comm string, start uint64) string {
	return fmt.Sprintf("%d (%s) S 1 %d %d 0 -1 4194560 12345 0 3 0 100 50 0 0 20 0 8 0 %d 123456789 4096 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 3 0 0 0 0 0\n",
		pid, comm, pid, pid, start)
}

// StatusFile is /proc/<pid>/status with the given name and real uid.
func StatusFile(comm, uid string) string {
	return fmt.Sprintf("Name:\t%s\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nNgid:\t0\nPid:\t42\nPPid:\t1\nTracerPid:\t0\nUid:\t%s\t%s\t%s\t%s\nGid:\t1000\t1000\t1000\t1000\nFDSize:\t256\n",
		comm, uid, uid, uid, uid)
}

// Write writes /proc/<pid>/{stat,comm,status,cgroup} under dir.
func Write(t testing.TB, dir string, pid uint32, p Process) {
	t.Helper()
	pidDir := filepath.Join(dir, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"stat":   StatLine(pid, p.Comm, p.Start),
		"comm":   p.Comm + "\n",
		"status": StatusFile(p.Comm, p.UID),
		"cgroup": p.Cgroup,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(pidDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
