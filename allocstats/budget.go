package allocstats

import (
	"errors"
	"sync"
	"time"
)

// errBufferBudget: a connection's unfinished line was the biggest when the
// buffer budget ran out; the connection is closed.
var errBufferBudget = errors.New("the buffer budget for unfinished lines is spent and this connection held the most")

// bufferBudget bounds the memory that all connections together hold in
// unfinished lines. A connection that needs more than is left makes room
// by closing the connection that holds the most (the oldest of equals),
// which may be itself: a client trickling half-lines cannot starve the
// others, and many of them cannot grow the daemon past the budget.
type bufferBudget struct {
	limit int

	mu   sync.Mutex
	used int
	held map[*lineReader]struct{} // readers holding bytes
	// evictions counts connections closed to make room.
	evictions uint64
}

func newBufferBudget(limit int) *bufferBudget {
	return &bufferBudget{limit: limit, held: make(map[*lineReader]struct{})}
}

// charge sets lr's holding to n bytes, evicting others (or failing, when
// lr is the biggest) if the budget would be exceeded.
func (b *bufferBudget) charge(lr *lineReader, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if lr.evicted {
		return errBufferBudget
	}
	if lr.charged == 0 {
		lr.since = time.Now()
	}
	for b.used-lr.charged+n > b.limit {
		victim := lr
		victimSize := n
		for r := range b.held {
			if r == lr {
				continue
			}
			if r.charged > victimSize || (r.charged == victimSize && r.since.Before(victim.since)) {
				victim, victimSize = r, r.charged
			}
		}
		b.evictions++
		b.releaseLocked(victim)
		victim.evicted = true
		if victim == lr {
			return errBufferBudget
		}
		if victim.onEvict != nil {
			victim.onEvict()
		}
	}
	b.used += n - lr.charged
	lr.charged = n
	if n > 0 {
		b.held[lr] = struct{}{}
	} else {
		delete(b.held, lr)
	}
	return nil
}

// release returns everything lr holds.
func (b *bufferBudget) release(lr *lineReader) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.releaseLocked(lr)
}

func (b *bufferBudget) releaseLocked(lr *lineReader) {
	b.used -= lr.charged
	lr.charged = 0
	delete(b.held, lr)
}

// Used returns the bytes held now, and the evictions so far.
func (b *bufferBudget) stats() (used int, evictions uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.evictions
}
