package allocstats

// A session's hello and stats messages, applied to its entry.

import (
	"sort"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"github.com/gpumem/gpumem_exporter/internal/satmath"
)

// counterState turns a client counter that may reset into one that never
// decreases: exported = base + raw, and base grows by the last raw value
// whenever raw goes down.
type counterState struct {
	seen    bool
	lastRaw uint64
	base    uint64
}

func (c *counterState) update(raw uint64) uint64 {
	if c.seen && raw < c.lastRaw {
		c.base = satmath.Add(c.base, c.lastRaw)
	}
	c.seen = true
	c.lastRaw = raw
	return satmath.Add(c.base, raw)
}

// hello records a hello message of a session bound to bound (nil: not
// bound yet) and returns its entry.
func (s *Store) hello(bound *procEntry, id Identity, h wire.Hello) (*procEntry, error) {
	if bound != nil {
		if err := lockBound(bound); err != nil {
			return bound, err
		}
		bound.framework, bound.frameworkVersion, bound.client, bound.warnBefore = h.Framework, h.FrameworkVersion, h.Client, h.WarnBefore
		bound.mu.Unlock()
		s.version.Add(1)
		return bound, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.bindLocked(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.framework, e.frameworkVersion, e.client, e.warnBefore = h.Framework, h.FrameworkVersion, h.Client, h.WarnBefore
	e.mu.Unlock()
	s.version.Add(1)
	return e, nil
}

// stats applies a validated stats message of a session. A session's later
// messages lock only its process's entry; its first one (bound nil) takes
// the store's lock to find or create the entry.
func (s *Store) stats(bound *procEntry, id Identity, devices []DeviceReport, now time.Time, maxDevices int) (*procEntry, error) {
	if bound != nil {
		if err := lockBound(bound); err != nil {
			return bound, err
		}
		defer bound.mu.Unlock()
		if err := bound.checkCapLocked(devices, maxDevices); err != nil {
			return bound, err
		}
		s.applyLocked(bound, devices, now)
		return bound, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkNewCapLocked(id, devices, maxDevices); err != nil {
		return nil, err
	}
	e, err := s.bindLocked(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	s.applyLocked(e, devices, now)
	e.mu.Unlock()
	return e, nil
}

// applyLocked applies devices to e; the caller holds e.mu.
func (s *Store) applyLocked(e *procEntry, devices []DeviceReport, now time.Time) {
	for _, r := range devices {
		s.deviceLocked(e, r.UUID).apply(r, now)
	}
	// Raised under e.mu, which a reader's copy of e waits for.
	s.version.Add(1)
}

// apply records a client's report r of the device, received at now: the
// one place where what a client said (DeviceReport) becomes what the store
// keeps (DeviceStats). They are two types because the store keeps more
// than a report says and not all of it as said: counters that never
// decrease where the client's may reset, the floor of active memory over
// the reports, the last OOM, when the device was last named.
func (d *deviceEntry) apply(r DeviceReport, now time.Time) {
	st := &d.stats
	st.HasStats = true
	st.Reserved = r.Reserved
	st.Active = r.Active
	st.Allocated = r.Allocated
	st.InactiveSplit = r.InactiveSplit
	st.PeakReserved = r.PeakReserved
	st.PeakActive = r.PeakActive
	st.Limit = r.Limit
	// The floor goes with active: a report without active exports
	// neither.
	st.ActiveFloor = Optional{}
	at := r.At
	if at.IsZero() {
		at = now
	}
	st.SampledAt = at
	if r.Active.OK {
		d.floor.Observe(at, r.Active.V)
		if v, ok := d.floor.Floor(); ok {
			st.ActiveFloor = Some(v)
		}
	}
	st.AllocRetries = d.retries.apply(r.AllocRetries)
	st.OOMs = d.ooms.apply(r.OOMs)
	st.LastReport = now
}

func (c *counterState) apply(raw Optional) Optional {
	if !raw.OK {
		return Optional{}
	}
	return Some(c.update(raw.V))
}

// device returns the entry's device uuid, or nil. The caller holds e.mu.
func (e *procEntry) device(uuid string) *deviceEntry {
	i := sort.Search(len(e.devices), func(i int) bool { return e.devices[i].stats.UUID >= uuid })
	if i < len(e.devices) && e.devices[i].stats.UUID == uuid {
		return e.devices[i]
	}
	return nil
}

// deviceLocked returns the entry's device uuid, creating it if absent. The
// caller holds e.mu.
func (s *Store) deviceLocked(e *procEntry, uuid string) *deviceEntry {
	i := sort.Search(len(e.devices), func(i int) bool { return e.devices[i].stats.UUID >= uuid })
	if i < len(e.devices) && e.devices[i].stats.UUID == uuid {
		return e.devices[i]
	}
	d := &deviceEntry{stats: DeviceStats{UUID: uuid}}
	e.devices = append(e.devices, nil)
	copy(e.devices[i+1:], e.devices[i:])
	e.devices[i] = d
	if !e.removed.Load() && !e.exited.Load() {
		s.nDevices.Add(1)
	}
	return d
}
