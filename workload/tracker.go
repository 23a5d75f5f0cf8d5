package workload

import (
	"errors"
	"io/fs"
)

// Tracker names processes and tells whether they still run. ProcResolver
// is one, for the processes /proc describes; the simulated node is another,
// for its own.
type Tracker interface {
	Lookup(pid uint32) (Info, bool)
	// Alive reports whether pid still runs with start time start (0:
	// any), and known whether the tracker can tell.
	Alive(pid uint32, start uint64) (alive, known bool)
}

// Trackers asks each tracker in turn: the first that knows a pid answers.
type Trackers []Tracker

// Lookup is the first tracker's that names pid.
func (ts Trackers) Lookup(pid uint32) (Info, bool) {
	for _, t := range ts {
		if in, ok := t.Lookup(pid); ok {
			return in, true
		}
	}
	return Info{}, false
}

// Alive is the first tracker's that can tell.
func (ts Trackers) Alive(pid uint32, start uint64) (alive, known bool) {
	for _, t := range ts {
		if alive, known := t.Alive(pid, start); known {
			return alive, true
		}
	}
	return false, false
}

// Running tells the allocator store's Prune whether a reporting process
// still runs: t answers for the pids it knows (a ProcResolver for those its
// Refresh of the same poll read, so that each /proc/<pid>/stat is read once
// a poll), /proc/<pid>/stat under procPath for the rest. It answers true
// when it cannot tell (the store's TTL still applies after a disconnect).
func Running(procPath string, t Tracker) func(pid uint32, start uint64) bool {
	return func(pid uint32, start uint64) bool {
		if alive, known := t.Alive(pid, start); known {
			return alive
		}
		st, err := StartTime(procPath, pid)
		if errors.Is(err, fs.ErrNotExist) {
			return false
		}
		if err != nil {
			return true
		}
		return start == 0 || st == start
	}
}
