package workload

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/procfixture"
)

// fakeProcess is one process of a fixture procfs tree.
type fakeProcess = procfixture.Process

var (
	statLine     = procfixture.StatLine
	statusFile   = procfixture.StatusFile
	writeProcess = func(t *testing.T, dir string, pid uint32, p fakeProcess) { procfixture.Write(t, dir, pid, p) }
)

func writeProcFile(t *testing.T, dir string, pid uint32, name, content string) {
	t.Helper()
	pidDir := filepath.Join(dir, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pidDir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestStartTime(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    uint64
		wantErr bool
	}{
		{"plain command name", statLine(42, "python3", 987654), 987654, false},
		{"command name with spaces and parentheses", statLine(42, "a) (b c) S 9 9", 5555), 5555, false},
		{"command name that is only a parenthesis", statLine(42, ")", 77), 77, false},
		{"start time at the top of the range", statLine(42, "x", 18446744073709551615), 18446744073709551615, false},
		{"too few fields", "42 (python3) S 1 42 42 0\n", 0, true},
		{"no closing parenthesis", "42 (python3 S 1 42", 0, true},
		{"start time not a number", "42 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 abc 20\n", 0, true},
		{"empty file", "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeProcFile(t, dir, 42, "stat", tt.stat)
			got, err := StartTime(dir, 42)
			if (err != nil) != tt.wantErr {
				t.Fatalf("StartTime error = %v, want error: %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("StartTime = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestMissingProcessIsNotExist(t *testing.T) {
	dir := t.TempDir()
	readers := map[string]func() error{
		"StartTime": func() error { _, err := StartTime(dir, 4242); return err },
		"Comm":      func() error { _, err := Comm(dir, 4242); return err },
		"RealUID":   func() error { _, err := RealUID(dir, 4242); return err },
		"Cgroup":    func() error { _, err := Cgroup(dir, 4242); return err },
	}
	for name, read := range readers {
		t.Run(name, func(t *testing.T) {
			err := read()
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s of a missing pid: error %v does not match fs.ErrNotExist", name, err)
			}
		})
	}
}

func TestComm(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"newline is trimmed", "python3\n", "python3"},
		{"spaces are kept", "pt_main thread\n", "pt_main thread"},
		{"invalid UTF-8 is replaced", "bad\xffname\n", "bad\uFFFDname"},
		{"empty", "", ""},
		{"a terminal title and clear screen", "\x1b]0;PWN\a\x1b[2J\n", "\uFFFD]0;PWN\uFFFD\uFFFD[2J"},
		{"DEL and a tab", "a\x7fb\tc\n", "a\uFFFDb\uFFFDc"},
		{"C1 controls (CSI, NEL)", "a\u009b2Jb\u0085\n", "a\uFFFD2Jb\uFFFD"},
		{"a newline inside the name", "two\nlines\n", "two\uFFFDlines"},
		{"bidi overrides and isolates", "gpt\u202eexe.\u2066x\u2069\u200f\n", "gpt\uFFFDexe.\uFFFDx\uFFFD\uFFFD"},
		{"other non-ASCII is kept", "训练-é\n", "训练-é"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeProcFile(t, dir, 7, "comm", tt.file)
			got, err := Comm(dir, 7)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Comm = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRealUID(t *testing.T) {
	tests := []struct {
		name, status, want string
		wantErr            bool
	}{
		{"real uid is the first number", "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n", "1000", false},
		{"root", statusFile("x", "0"), "0", false},
		{"no Uid line", "Name:\tx\nGid:\t0\t0\t0\t0\n", "", true},
		{"empty Uid line", "Uid:\n", "", true},
		{"uid not a number", "Uid:\tme\t0\t0\t0\n", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeProcFile(t, dir, 7, "status", tt.status)
			got, err := RealUID(dir, 7)
			if (err != nil) != tt.wantErr {
				t.Fatalf("RealUID error = %v, want error: %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("RealUID = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestReadersOnThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no procfs here")
	}
	pid := uint32(os.Getpid())
	start, err := StartTime("/proc", pid)
	if err != nil || start == 0 {
		t.Fatalf("StartTime(/proc, self) = %d, %v; want a positive start time", start, err)
	}
	again, err := StartTime("/proc", pid)
	if err != nil || again != start {
		t.Errorf("StartTime changed between two reads: %d then %d (%v)", start, again, err)
	}
	uid, err := RealUID("/proc", pid)
	if err != nil || uid != strconv.Itoa(os.Getuid()) {
		t.Errorf("RealUID(/proc, self) = %q, %v; want %d", uid, err, os.Getuid())
	}
	if comm, err := Comm("/proc", pid); err != nil || comm == "" {
		t.Errorf("Comm(/proc, self) = %q, %v; want a name", comm, err)
	}
	if _, err := Cgroup("/proc", pid); err != nil {
		t.Errorf("Cgroup(/proc, self): %v", err)
	}
}
