package workload

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpumem/gpumem_exporter/internal/safetext"
)

// maxProcFile bounds what is read from one /proc file. The files read here
// are small (stat < 1 KiB, status a few KiB, cgroup v1 about 1 KiB); the
// bound keeps a broken or hostile procfs from growing the exporter.
const maxProcFile = 256 << 10

// readProcFile reads /proc/<pid>/<name> under procPath. A process that is
// gone, or exits during the read, gives an error that matches
// fs.ErrNotExist.
func readProcFile(procPath string, pid uint32, name string) ([]byte, error) {
	path := filepath.Join(procPath, strconv.FormatUint(uint64(pid), 10), name)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxProcFile))
	if err != nil {
		// Reading a /proc file of a process that exits after the open
		// fails with ESRCH: that is a missing process too.
		if errors.Is(err, syscall.ESRCH) {
			return nil, fmt.Errorf("reading %s: %w (%w)", path, fs.ErrNotExist, err)
		}
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, nil
}

// StartTime returns the start time of pid, field 22 of /proc/<pid>/stat, in
// clock ticks since boot. Together with the pid it names one process for its
// whole life. A missing pid gives an error that matches fs.ErrNotExist.
func StartTime(procPath string, pid uint32) (uint64, error) {
	data, err := readProcFile(procPath, pid, "stat")
	if err != nil {
		return 0, err
	}
	start, err := parseStatStartTime(data)
	if err != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
	}
	return start, nil
}

// parseStatStartTime reads field 22 of a stat line. Field 2, comm, is in
// parentheses and may itself contain spaces and parentheses, so the fields
// are counted from the last ')'.
func parseStatStartTime(data []byte) (uint64, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, errors.New("no ')' closing the command name")
	}
	// After ')' come fields 3 (state) onwards: field 22 is the 20th.
	fields := strings.Fields(string(data[end+1:]))
	const startField = 22 - 3
	if len(fields) <= startField {
		return 0, fmt.Errorf("%d fields after the command name, want more than %d", len(fields), startField)
	}
	start, err := strconv.ParseUint(fields[startField], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("start time: %w", err)
	}
	return start, nil
}

// Comm returns the command name of pid, /proc/<pid>/comm without its
// newline, as SafeName makes it. Any process names itself (prctl
// PR_SET_NAME), and the name goes to labels, the landing page, logs,
// OOM reports and Kubernetes Events: it is made safe here, once, for all
// of them.
func Comm(procPath string, pid uint32) (string, error) {
	data, err := readProcFile(procPath, pid, "comm")
	if err != nil {
		return "", err
	}
	return SafeName(strings.TrimSuffix(string(data), "\n")), nil
}

// SafeName is safetext.Clean: what a terminal or a text renderer would
// act on or hide (controls, bidirectional and zero-width characters,
// bytes that are not UTF-8) becomes U+FFFD.
func SafeName(s string) string { return safetext.Clean(s) }

// RealUID returns the real user ID of pid, the first number of the Uid:
// line of /proc/<pid>/status, in decimal.
func RealUID(procPath string, pid uint32) (string, error) {
	data, err := readProcFile(procPath, pid, "status")
	if err != nil {
		return "", err
	}
	uid, err := parseStatusUID(data)
	if err != nil {
		return "", fmt.Errorf("parsing /proc/%d/status: %w", pid, err)
	}
	return uid, nil
}

func parseStatusUID(data []byte) (string, error) {
	for line := range strings.SplitSeq(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return "", errors.New("empty Uid: line")
		}
		if _, err := strconv.ParseUint(fields[0], 10, 32); err != nil {
			return "", fmt.Errorf("real uid: %w", err)
		}
		return fields[0], nil
	}
	return "", errors.New("no Uid: line")
}

// Cgroup returns the content of /proc/<pid>/cgroup, for ParseCgroup.
func Cgroup(procPath string, pid uint32) (string, error) {
	data, err := readProcFile(procPath, pid, "cgroup")
	if err != nil {
		return "", err
	}
	return string(data), nil
}
