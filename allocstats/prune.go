package allocstats

// Pruning: processes that exited, sessions closed past the TTL, and
// devices where NVML does not list the process.

import "time"

// prunedSince reports whether Prune, asking which processes still run,
// has completed at or after t: every process that had exited by then is
// marked exited or dropped.
func (s *Store) prunedSince(t time.Time) bool { return s.prunedAt.Load() >= t.UnixNano() }

// Prune is called once per NVML poll. It drops every process that alive
// says is gone (alive must answer true when it cannot tell), and
// every process whose sessions have all been closed for at least the
// TTL. A gone process with a session still open leaves the index at
// once (it is no longer exported, and its pid is free for a new entry),
// but its sessions may still apply the lines it queued before it
// exited: the entry is dropped when the last of them closes. alive is
// called without the store's lock held; it may be nil.
func (s *Store) Prune(now time.Time, alive func(pid uint32, startTime uint64) bool) {
	var dead map[*procEntry]bool
	if alive != nil {
		for _, e := range s.sorted() {
			if !alive(e.pid, e.startTime) {
				if dead == nil {
					dead = make(map[*procEntry]bool)
				}
				dead[e] = true
			}
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	sorted := s.sorted()
	var kept []*procEntry
	for i, e := range sorted {
		expired := e.conns.Load() == 0 && now.Sub(e.disconnectedAt) >= s.ttl
		switch {
		case dead[e] && e.conns.Load() > 0:
			s.exitLocked(e)
			s.lingerLocked(e, now)
		case dead[e]:
			s.dropLocked(e)
			s.lingerLocked(e, now)
		case expired:
			s.dropLocked(e)
		default:
			if kept != nil {
				kept = append(kept, e)
			}
			continue
		}
		if kept == nil {
			kept = make([]*procEntry, i, len(sorted)-1)
			copy(kept, sorted[:i])
		}
	}
	if kept != nil {
		s.publishLocked(kept)
	}
	if alive != nil {
		s.prunedAt.Store(now.UnixNano())
	}
}

// DropUnlisted is called once per NVML poll. listed says whether NVML lists
// the process pid on the device uuid (it must answer true when it cannot
// tell, and must not call the store). The state of a process on a device
// where NVML does not list it is kept for grace, then dropped: a
// process reports only devices it uses, and NVML lists a process on every
// device where it holds a context, so a report NVML never confirms is
// either a process NVML cannot see or a made-up device, and neither may
// hold series for long. The process's entry stays (a later message may
// name the device again). Like Processes, it locks one entry at a time.
func (s *Store) DropUnlisted(now time.Time, grace time.Duration, listed func(pid uint32, uuid string) bool) {
	for _, e := range s.sorted() {
		e.mu.Lock()
		kept := e.devices[:0]
		for _, d := range e.devices {
			switch {
			case listed(e.pid, d.stats.UUID):
				d.unlistedSince = time.Time{}
			case d.unlistedSince.IsZero():
				d.unlistedSince = now
			case now.Sub(d.unlistedSince) >= grace:
				if !e.removed.Load() && !e.exited.Load() {
					s.nDevices.Add(-1)
				}
				continue
			}
			kept = append(kept, d)
		}
		dropped := len(e.devices) - len(kept)
		clear(e.devices[len(kept):])
		e.devices = kept
		e.mu.Unlock()
		if dropped > 0 {
			s.version.Add(1)
		}
	}
}
