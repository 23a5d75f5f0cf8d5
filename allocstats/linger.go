package allocstats

// The linger: processes that exited, kept so that a scrape sees their
// last counters.

import "time"

// goneEntry is a process that exited at at.
type goneEntry struct {
	e  *procEntry
	at time.Time
}

// SetLinger sets how long the store keeps a process after it exited
// (Prune found it gone): Processes lists it, with Exited set,
// until the first Prune at least d after it exited, so that a scrape sees
// the counters it reported last (an OOM raised right before it exited).
// 0 (the default) drops it at once. An exited process counts against its
// uid's process caps until its linger ends, and only a new process of the
// same uid pushes it out early (see admitLocked): no user can push out
// another's. Call it before the store is used.
func (s *Store) SetLinger(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.linger = max(d, 0)
}

// lingerLocked keeps e, a process that exited at now, for the linger.
func (s *Store) lingerLocked(e *procEntry, now time.Time) {
	if s.linger <= 0 {
		return
	}
	var gone []goneEntry
	if g := s.gone.Load(); g != nil {
		gone = *g
	}
	next := make([]goneEntry, 0, len(gone)+1)
	next = append(next, gone...)
	s.nGone++
	s.gonePerUID[e.uid]++
	next = append(next, goneEntry{e, now})
	s.gone.Store(&next)
	s.version.Add(1)
}

// forgetGoneLocked takes g out of the lingering counts.
func (s *Store) forgetGoneLocked(g goneEntry) {
	s.nGone--
	if s.gonePerUID[g.e.uid]--; s.gonePerUID[g.e.uid] <= 0 {
		delete(s.gonePerUID, g.e.uid)
	}
}

// evictGoneLocked drops the oldest lingering process of uid, to make room
// for a new process of the same uid; false if uid has none.
func (s *Store) evictGoneLocked(uid uint32) bool {
	g := s.gone.Load()
	if g == nil || s.gonePerUID[uid] == 0 {
		return false
	}
	gone := *g
	for i, ge := range gone {
		if ge.e.uid != uid {
			continue
		}
		next := make([]goneEntry, 0, len(gone)-1)
		next = append(next, gone[:i]...)
		next = append(next, gone[i+1:]...)
		s.forgetGoneLocked(ge)
		s.gone.Store(&next)
		s.version.Add(1)
		return true
	}
	return false
}

// expireLocked forgets the exited processes whose linger has passed at
// now.
func (s *Store) expireLocked(now time.Time) {
	g := s.gone.Load()
	if g == nil || len(*g) == 0 {
		return
	}
	gone := *g
	i := 0
	for i < len(gone) && now.Sub(gone[i].at) >= s.linger {
		s.forgetGoneLocked(gone[i])
		i++
	}
	if i > 0 {
		next := append([]goneEntry(nil), gone[i:]...)
		s.gone.Store(&next)
		s.version.Add(1)
	}
}
