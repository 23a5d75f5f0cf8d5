package allocstats

// Feed: processes that report without a connection.

import (
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
)

// Feed applies a stats message from a process that reports without a
// connection (the simulated node), as if it came over the socket from id.
// Its entry is kept for the TTL after the last Feed, or until Remove or
// Prune finds the process gone. framework, if not empty, is recorded as a
// hello would.
func (s *Store) Feed(id Identity, framework string, devices []DeviceReport, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewCapLocked(id, devices, DefaultMaxDevices); err != nil {
		return err
	}
	e := s.feedEntryLocked(id, now)
	e.mu.Lock()
	defer e.mu.Unlock()
	if framework != "" {
		e.framework = wire.Sanitize(framework)
	}
	s.applyLocked(e, devices, now)
	return nil
}

// FeedOOM records an oom message of a process that reports without a
// connection, as Feed does for stats.
func (s *Store) FeedOOM(id Identity, m OOMMessage, now time.Time) (OOMEvent, error) {
	s.mu.Lock()
	if err := s.checkNewCapLocked(id, []DeviceReport{{UUID: m.UUID}}, DefaultMaxDevices); err != nil {
		s.mu.Unlock()
		return OOMEvent{}, err
	}
	e := s.feedEntryLocked(id, now)
	e.mu.Lock()
	ev := s.recordOOMLocked(e, m, now)
	e.mu.Unlock()
	s.mu.Unlock()
	s.notifyOOM(ev)
	return ev, nil
}

// feedEntryLocked returns the entry of id, created (replacing one of an
// earlier holder of the pid) if needed, with its TTL restarted at now.
func (s *Store) feedEntryLocked(id Identity, now time.Time) *procEntry {
	e, ok := s.procs[id.PID]
	if !ok || !e.sameProcess(id) || !e.fed {
		e = &procEntry{pid: id.PID, uid: id.UID, startTime: id.StartTime, fed: true}
		s.putLocked(e)
	}
	if e.conns.Load() == 0 {
		e.disconnectedAt = now
	}
	return e
}
