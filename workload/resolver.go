package workload

import (
	"errors"
	"io/fs"
	"sync"
	"sync/atomic"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
)

// MaxCachedProcesses bounds the resolver's cache whatever the pid list:
// pids past it in one Refresh are not resolved.
const MaxCachedProcesses = 65536

// ProcResolver is a Resolver that reads /proc under procPath and names
// Kubernetes pods and containers through a PodLookup.
//
// Refresh runs in one goroutine (the poller); Lookup may run in any number
// of scrapes at once. Refresh builds a new map and publishes it atomically,
// so a lookup never waits for /proc.
type ProcResolver struct {
	procPath string
	pods     PodLookup
	logger   log.Logger

	refreshMu sync.Mutex // serialises Refresh
	cache     atomic.Pointer[map[uint32]cacheEntry]
	capWarned bool // guarded by refreshMu
	maxCached int  // MaxCachedProcesses; smaller in tests
}

type cacheEntry struct {
	info Info
	// failed marks a negative entry: the pid was listed but /proc could not
	// tell about it (it exited, or could not be read). It is read again on
	// the next Refresh that lists it.
	failed bool
	// gone: the failure was that the process does not exist.
	gone bool
}

var _ Resolver = (*ProcResolver)(nil)

// NewProcResolver returns a resolver reading procPath (/proc, or /host/proc
// in a container). pods may be nil: no Kubernetes names then.
func NewProcResolver(procPath string, pods PodLookup, logger log.Logger) *ProcResolver {
	if logger == nil {
		logger = log.NewNopLogger()
	}
	r := &ProcResolver{
		procPath:  procPath,
		pods:      pods,
		logger:    logger,
		maxCached: MaxCachedProcesses,
	}
	empty := map[uint32]cacheEntry{}
	r.cache.Store(&empty)
	return r
}

// Refresh implements Resolver. It reads one /proc/<pid>/stat per pid, and
// comm, status and cgroup only for pids that are new or were reused.
func (r *ProcResolver) Refresh(pids []uint32) {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()

	if len(pids) > r.maxCached {
		if !r.capWarned {
			level.Warn(r.logger).Log("msg", "too many processes to resolve; resolving the first ones only", "processes", len(pids), "max", r.maxCached)
			r.capWarned = true
		}
		pids = pids[:r.maxCached]
	}
	old := *r.cache.Load()
	next := make(map[uint32]cacheEntry, len(pids))
	for _, pid := range pids {
		if _, done := next[pid]; done {
			continue
		}
		next[pid] = r.resolve(pid, old)
	}
	r.cache.Store(&next)
}

// resolve returns the entry for pid, reusing the cached one while the
// start time says it is the same process.
func (r *ProcResolver) resolve(pid uint32, old map[uint32]cacheEntry) cacheEntry {
	prev, known := old[pid]
	start, err := StartTime(r.procPath, pid)
	if err != nil {
		r.logReadError(pid, "stat", err, known && prev.failed)
		return cacheEntry{info: Info{PID: pid}, failed: true, gone: errors.Is(err, fs.ErrNotExist)}
	}
	if known && !prev.failed && prev.info.StartTime == start {
		return prev
	}
	info, err := r.read(pid, start)
	if err != nil {
		r.logReadError(pid, "details", err, known && prev.failed)
		return cacheEntry{info: Info{PID: pid}, failed: true, gone: errors.Is(err, fs.ErrNotExist)}
	}
	return cacheEntry{info: info}
}

// Alive answers from the last Refresh whether the process pid that started
// at start (0: any) was running then, so that a poll reads each
// /proc/<pid>/stat once: the store's prune asks right after the Refresh
// that read it. known is false for a pid that Refresh did not read, and
// for one whose /proc entry could not be read for another reason than
// its absence.
func (r *ProcResolver) Alive(pid uint32, start uint64) (alive, known bool) {
	e, ok := (*r.cache.Load())[pid]
	switch {
	case !ok:
		return false, false
	case e.gone:
		return false, true
	case e.failed:
		return false, false
	default:
		return start == 0 || e.info.StartTime == start, true
	}
}

// read reads what /proc says about pid. A process that is gone is an
// error; a file that cannot be read for another reason leaves its fields
// empty and the rest is kept.
func (r *ProcResolver) read(pid uint32, start uint64) (Info, error) {
	info := Info{PID: pid, StartTime: start}
	var errs []error
	comm, err := Comm(r.procPath, pid)
	if err != nil {
		errs = append(errs, err)
	}
	info.Comm = comm
	uid, err := RealUID(r.procPath, pid)
	if err != nil {
		errs = append(errs, err)
	}
	info.UID = uid
	content, err := Cgroup(r.procPath, pid)
	if err != nil {
		errs = append(errs, err)
	} else {
		cg := ParseCgroup(content)
		info.Cgroup, info.ContainerID, info.PodUID, info.SlurmJobID = cg.Path, cg.ContainerID, cg.PodUID, cg.SlurmJobID
	}
	err = errors.Join(errs...)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, err
	}
	// The pid may have been reused between the reads: then the details
	// belong to another process, and the next Refresh reads them again.
	if again, serr := StartTime(r.procPath, pid); serr != nil || again != start {
		if serr == nil {
			serr = errors.New("start time changed while reading")
		}
		return Info{}, errors.Join(serr, err)
	}
	if err != nil {
		level.Warn(r.logger).Log("msg", "process partly resolved", "pid", pid, "err", err)
	}
	return info, nil
}

// logReadError logs a failure to read pid. A process gone between NVML's
// list and /proc is routine, and so is a failure already logged for this
// pid: both go to debug.
func (r *ProcResolver) logReadError(pid uint32, what string, err error, repeated bool) {
	if repeated || errors.Is(err, fs.ErrNotExist) {
		level.Debug(r.logger).Log("msg", "process not resolved", "pid", pid, "read", what, "err", err)
		return
	}
	level.Warn(r.logger).Log("msg", "process not resolved", "pid", pid, "read", what, "err", err)
}

// Lookup implements Resolver. ok reports whether pid was in the last
// Refresh; a pid whose /proc entry could not be read then has an Info with
// only PID set. Pod, namespace and container names come from the
// PodLookup at lookup time, so they appear as soon as it knows them.
func (r *ProcResolver) Lookup(pid uint32) (Info, bool) {
	e, ok := (*r.cache.Load())[pid]
	if !ok {
		return Info{}, false
	}
	info := e.info
	if r.pods != nil {
		if info.PodUID != "" {
			info.Namespace, info.Pod, _ = r.pods.Pod(info.PodUID)
		}
		if info.ContainerID != "" {
			info.Container, _ = r.pods.Container(info.ContainerID)
		}
	}
	return info, true
}
