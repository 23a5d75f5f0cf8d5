package attribution

import (
	"sync"

	"github.com/gpumem/gpumem_exporter/workload"
)

// Memory remembers the labels each reporting process was last joined with
// while it ran, so that the rows of a process that exited (kept by the
// store for the OOM linger) carry the same labels, and so continue its
// series: once a process exits, /proc and the workload cache no longer
// name it. It also remembers whether NVML listed the process on the device
// while it ran: only then does its exited row linger, so that processes
// NVML never saw (a flood of short ones, or one NVML cannot see) leave no
// series behind. A process is known by its pid and start time, so a new
// holder of the pid neither takes nor erases what an exited one left. It
// forgets a process as soon as a join no longer holds it. Safe for
// concurrent use; its size is bounded by the store's.
type Memory struct {
	mu   sync.Mutex
	rows map[memoryKey]remembered
}

type memoryKey struct {
	pid   uint32
	start uint64
	uuid  string
}

type remembered struct {
	info      workload.Info
	comm      string
	framework string
	listed    bool // NVML listed the process on the device in a join
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{rows: map[memoryKey]remembered{}} }

// apply records the labels of running processes' rows, labels the rows of
// exited ones with what it recorded (dropping, in place, those it never
// saw run with NVML listing them on the device), and forgets what rows no
// longer hold.
func (m *Memory) apply(rows []Row) []Row {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := make(map[memoryKey]bool, len(rows))
	kept := rows[:0]
	for _, r := range rows {
		k := memoryKey{r.PID, r.start, r.UUID}
		if r.Alloc == nil {
			kept = append(kept, r)
			continue
		}
		seen[k] = true
		if !r.Exited {
			listed := r.NVML != nil || m.rows[k].listed
			m.rows[k] = remembered{r.Info, r.Comm, r.Framework, listed}
			kept = append(kept, r)
			continue
		}
		was, ok := m.rows[k]
		if !ok || !was.listed {
			continue
		}
		r.Info, r.Comm = was.info, was.comm
		if r.Framework == "" {
			r.Framework = was.framework
		}
		kept = append(kept, r)
	}
	clear(rows[len(kept):])
	for k := range m.rows {
		if !seen[k] {
			delete(m.rows, k)
		}
	}
	return kept
}
