package attribution

import (
	"time"

	"github.com/gpumem/gpumem_exporter/nvmlpoll"
)

// ViewObserver takes the join's view after each NVML poll (the OOM
// reports keep each process's context from it, the forecaster its trend).
type ViewObserver interface {
	ObserveView(View)
}

// Follower joins the sources after each NVML poll (nvmlpoll.Poller.OnPoll)
// and hands the view to its observers, in order, from the poll's
// goroutine. When NVML read the same as at the last join and the
// allocator store has not changed since (its Version), the join would
// give the same rows: it is skipped, for up to followRefresh, and the
// observers keep what they took last.
type Follower struct {
	src       Sources
	observers []ViewObserver

	// What the last join read: the snapshot, the store's version and
	// when (Observe's goroutine alone uses them).
	snap    *nvmlpoll.Snapshot
	version uint64
	at      time.Time
}

// followRefresh bounds how long the Follower trusts that unchanged readings
// join to the same rows: the workload cache (which holds back the rows of
// pids it does not know yet) has no version of its own.
const followRefresh = 10 * time.Second

// versioned is an allocator source that says when what it returns
// changed (allocstats.Store.Version).
type versioned interface{ Version() uint64 }

// NewFollower returns a Follower of src that hands each view to observers.
func NewFollower(src Sources, observers ...ViewObserver) *Follower {
	return &Follower{src: src, observers: observers}
}

// Observe joins snap with the other sources and hands the view on, unless
// nothing changed since the last join. Call it from one goroutine.
func (f *Follower) Observe(snap *nvmlpoll.Snapshot) {
	now := time.Now()
	vs, ok := f.src.Allocator.(versioned)
	var version uint64
	if ok {
		version = vs.Version() // before the join: a change during it is seen next time
		if f.snap != nil && version == f.version && now.Sub(f.at) < followRefresh && snap.SameReadings(f.snap) {
			return
		}
	}
	v := f.src.ReadAt(snap)
	if ok && snap != nil {
		f.snap, f.version, f.at = snap, version, now
	}
	for _, o := range f.observers {
		o.ObserveView(v)
	}
}
