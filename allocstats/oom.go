package allocstats

// Out-of-memory events: recorded in the store and handed to its
// observers (OOMObserver), each with the client to answer (Replier).

import "time"

// OOMEvent is one out-of-memory event, as recorded in the store.
type OOMEvent struct {
	Time      time.Time
	PID       uint32
	UID       uint32
	StartTime uint64
	UUID      string // as NVML spells it
	Requested uint64 // bytes the failed allocation asked for
	Limit     Optional
	Free      Optional
	// Stats is the process's allocator on the device as it stood when the
	// oom message came: a client sends its stats at the failure just
	// before it, so these are the figures at the failure.
	Stats DeviceStats
	// ReplyTo, when set, is the client that sent the oom message: the
	// daemon's verdict goes back to it.
	ReplyTo Replier
}

// Replier takes the daemon's messages to one client (a verdict, a
// warning), a protocol line each, newline included. Reply never blocks
// for long and may fail silently. A connection of the socket server is
// one.
type Replier interface {
	Reply(line []byte)
}

// OOMObserver takes every out-of-memory event the store records
// (oom.Reports, which builds the report and answers the client).
type OOMObserver interface {
	ObserveOOM(ev OOMEvent)
}

// OOMObservers is an OOMObserver that hands each event to every one of
// its own, in order: the store's.
type OOMObservers []OOMObserver

// ObserveOOM implements OOMObserver.
func (os OOMObservers) ObserveOOM(ev OOMEvent) {
	for _, o := range os {
		o.ObserveOOM(ev)
	}
}

// OnOOM adds o to the observers called, synchronously and without the
// store's lock, after each oom message the store records (Session.OOM).
// o must be fast. Add observers before the store is used.
func (s *Store) OnOOM(o OOMObserver) {
	s.oomObservers = append(s.oomObservers, o)
}

// oom records an oom message of a session bound to bound (nil: not bound
// yet).
func (s *Store) oom(bound *procEntry, id Identity, m OOMMessage, now time.Time, maxDevices int, replyTo Replier) (*procEntry, OOMEvent, error) {
	devices := []DeviceReport{{UUID: m.UUID}}
	e := bound
	if e != nil {
		if err := lockBound(e); err != nil {
			return bound, OOMEvent{}, err
		}
		if err := e.checkCapLocked(devices, maxDevices); err != nil {
			e.mu.Unlock()
			return bound, OOMEvent{}, err
		}
	} else {
		s.mu.Lock()
		if err := s.checkNewCapLocked(id, devices, maxDevices); err != nil {
			s.mu.Unlock()
			return nil, OOMEvent{}, err
		}
		var err error
		if e, err = s.bindLocked(id); err != nil {
			s.mu.Unlock()
			return nil, OOMEvent{}, err
		}
		e.mu.Lock()
		s.mu.Unlock()
	}
	ev := s.recordOOMLocked(e, m, now)
	e.mu.Unlock()
	ev.ReplyTo = replyTo
	s.oomObservers.ObserveOOM(ev)
	return e, ev, nil
}

// recordOOMLocked records m in e; the caller holds e.mu.
func (s *Store) recordOOMLocked(e *procEntry, m OOMMessage, now time.Time) OOMEvent {
	d := s.deviceLocked(e, m.UUID)
	d.stats.LastOOMRequest = Some(m.RequestedBytes)
	d.stats.LastOOMTime = now
	d.stats.LastReport = now
	s.version.Add(1)
	return OOMEvent{
		Time:      now,
		PID:       e.pid,
		UID:       e.uid,
		StartTime: e.startTime,
		UUID:      m.UUID,
		Requested: m.RequestedBytes,
		Limit:     m.LimitBytes,
		Free:      m.FreeBytes,
		Stats:     d.stats,
	}
}

// SampleObserver takes every sample of active memory the store accepts,
// as the client sampled it: the trends of the forecaster are made of
// them, at the resolution of the clients' pushes rather than of the polls.
type SampleObserver interface {
	ObserveSample(pid uint32, start uint64, uuid string, at time.Time, active uint64)
}

// OnSample adds o to the observers called, synchronously and without the
// store's lock, with each device's active memory of every stats message
// the store accepts (at the report's own time, else when it came). o must
// be fast. Add observers before the store is used.
func (s *Store) OnSample(o SampleObserver) {
	s.sampleObservers = append(s.sampleObservers, o)
}

func (s *Store) notifySamples(id Identity, devices []DeviceReport, now time.Time) {
	if len(s.sampleObservers) == 0 {
		return
	}
	for _, d := range devices {
		if !d.Active.OK {
			continue
		}
		at := d.At
		if at.IsZero() {
			at = now
		}
		for _, o := range s.sampleObservers {
			o.ObserveSample(id.PID, id.StartTime, d.UUID, at, d.Active.V)
		}
	}
}
