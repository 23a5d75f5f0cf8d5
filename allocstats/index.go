package allocstats

// The store's index: procs and the sorted slice readers take without
// the lock, and the counts that go with them.

import (
	"sort"
	"sync/atomic"
)

// sorted returns the current index; the caller must not change it.
func (s *Store) sorted() []*procEntry {
	if p := s.index.Load(); p != nil {
		return *p
	}
	return nil
}

// publishLocked replaces the index.
func (s *Store) publishLocked(sorted []*procEntry) {
	s.index.Store(&sorted)
	s.version.Add(1)
}

// dropLocked forgets e for good (its sessions are refused) but leaves
// the index to the caller.
func (s *Store) dropLocked(e *procEntry) {
	s.unindexLocked(e, &e.removed)
}

// exitLocked takes e, a process that exited with a session still open,
// out of procs and the process counts, but lets its sessions apply their
// messages until they close; the index is left to the caller.
func (s *Store) exitLocked(e *procEntry) {
	s.unindexLocked(e, &e.exited)
}

// unindexLocked sets flag (removed or exited) and takes e's devices out
// of the count in one hold of e.mu, so that a device added or dropped
// meanwhile is counted once; then it takes e out of procs and the process
// counts.
func (s *Store) unindexLocked(e *procEntry, flag *atomic.Bool) {
	e.mu.Lock()
	flag.Store(true)
	s.nDevices.Add(-int64(len(e.devices)))
	e.mu.Unlock()
	if s.procs[e.pid] == e {
		delete(s.procs, e.pid)
	}
	s.nProcs--
	if s.perUID[e.uid]--; s.perUID[e.uid] <= 0 {
		delete(s.perUID, e.uid)
	}
}

func sortedIndex(sorted []*procEntry, pid uint32) int {
	return sort.Search(len(sorted), func(i int) bool { return sorted[i].pid >= pid })
}

// removeSortedLocked publishes the index without pid.
func (s *Store) removeSortedLocked(pid uint32) {
	sorted := s.sorted()
	i := sortedIndex(sorted, pid)
	if i < len(sorted) && sorted[i].pid == pid {
		next := make([]*procEntry, 0, len(sorted)-1)
		next = append(next, sorted[:i]...)
		s.publishLocked(append(next, sorted[i+1:]...))
	}
}

// putLocked inserts e, replacing any entry of the same pid, and publishes
// the index.
func (s *Store) putLocked(e *procEntry) {
	s.nProcs++
	s.perUID[e.uid]++
	sorted := s.sorted()
	i := sortedIndex(sorted, e.pid)
	if old, ok := s.procs[e.pid]; ok {
		s.dropLocked(old)
		next := append([]*procEntry(nil), sorted...)
		next[i] = e
		s.procs[e.pid] = e
		s.publishLocked(next)
		return
	}
	s.procs[e.pid] = e
	next := make([]*procEntry, 0, len(sorted)+1)
	next = append(next, sorted[:i]...)
	next = append(next, e)
	s.publishLocked(append(next, sorted[i:]...))
}
