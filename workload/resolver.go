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

// MaxPidfds is the most pidfds the resolver holds by default (one per
// process it watches); processes past it are checked through /proc.
const MaxPidfds = 1024

// ProcResolver names processes (a Tracker) from /proc under procPath and names
// Kubernetes pods and containers through a PodLookup.
//
// Refresh runs in one goroutine (the poller); Lookup may run in any number
// of scrapes at once. Refresh builds a new map and publishes it atomically,
// so a lookup never waits for /proc.
//
// Where procPath is a procfs of the exporter's own pid namespace, the
// resolver holds a pidfd of each process it resolved: while the pidfd says
// the process runs, the pid cannot have been reused and nothing is read
// again; one poll(2) over all of them a Refresh asks which exited. Without
// a pidfd (another namespace, an old kernel, past the cap), each Refresh
// reads /proc/<pid>/stat and compares the start time.
type ProcResolver struct {
	procPath string
	pods     PodLookup
	logger   log.Logger

	refreshMu sync.Mutex // serialises Refresh
	cache     atomic.Pointer[map[uint32]cacheEntry]
	capWarned bool // guarded by refreshMu

	// Guarded by refreshMu.
	watch   bool // pidfds name the processes of procPath
	maxFDs  int  // most pidfds held
	openFDs int  // pidfds held now
}

type cacheEntry struct {
	info Info
	// failed marks a negative entry: the pid was listed but /proc could not
	// tell about it (it exited, or could not be read). It is read again on
	// the next Refresh that lists it.
	failed bool
	// gone: the failure was that the process does not exist.
	gone bool
	// pidfd names the process of info (opened after its start time was
	// read and checked again after); -1 when there is none.
	pidfd int
}

var _ Tracker = (*ProcResolver)(nil)

// NewProcResolver returns a resolver reading procPath (/proc, or /host/proc
// in a container). pods may be nil: no Kubernetes names then.
func NewProcResolver(procPath string, pods PodLookup, logger log.Logger) *ProcResolver {
	if logger == nil {
		logger = log.NewNopLogger()
	}
	r := &ProcResolver{
		procPath: procPath,
		pods:     pods,
		logger:   logger,
		watch:    sameNamespace(procPath),
		maxFDs:   MaxPidfds,
	}
	empty := map[uint32]cacheEntry{}
	r.cache.Store(&empty)
	return r
}

// SetMaxPidfds sets how many pidfds the resolver may hold (the exporter's
// file descriptor budget); 0 checks every process through /proc. Call it
// before the first Refresh.
func (r *ProcResolver) SetMaxPidfds(n int) {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	r.maxFDs = max(n, 0)
}

// Close releases the pidfds and forgets every process. A Refresh after it
// (a poll still running while the daemon shuts down) reads /proc as a
// resolver without pidfds does.
func (r *ProcResolver) Close() {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	empty := map[uint32]cacheEntry{}
	for _, e := range *r.cache.Swap(&empty) {
		if e.pidfd >= 0 {
			closePidfd(e.pidfd)
		}
	}
	r.openFDs = 0
	r.watch = false
}

// Refresh is called once per poll, off the scrape path, with every pid
// the exporter currently exports, and forgets the pids not in it. It reads /proc/<pid>/stat of each pid that
// has no pidfd or whose pidfd says it exited, and comm, status and cgroup
// only for pids that are new or were reused.
func (r *ProcResolver) Refresh(pids []uint32) {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()

	if len(pids) > MaxCachedProcesses {
		if !r.capWarned {
			level.Warn(r.logger).Log("msg", "too many processes to resolve; resolving the first ones only", "processes", len(pids), "max", MaxCachedProcesses)
			r.capWarned = true
		}
		pids = pids[:MaxCachedProcesses]
	}
	old := *r.cache.Load()
	exited := r.exited(old)
	next := make(map[uint32]cacheEntry, len(pids))
	for _, pid := range pids {
		if _, done := next[pid]; done {
			continue
		}
		next[pid] = r.resolve(pid, old, exited[pid])
	}
	r.cache.Store(&next)
	// A pidfd not carried into next names a process no longer listed, or
	// one that exited: nothing reads it any more.
	for pid, e := range old {
		if n, kept := next[pid]; e.pidfd >= 0 && (!kept || n.pidfd != e.pidfd) {
			closePidfd(e.pidfd)
			r.openFDs--
		}
	}
}

// exited returns the pids of old whose pidfd says the process exited.
func (r *ProcResolver) exited(old map[uint32]cacheEntry) map[uint32]bool {
	var pids []uint32
	var fds []int
	for pid, e := range old {
		if e.pidfd >= 0 {
			pids = append(pids, pid)
			fds = append(fds, e.pidfd)
		}
	}
	out := make(map[uint32]bool, len(pids))
	for i, gone := range exitedPidfds(fds) {
		if gone {
			out[pids[i]] = true
		}
	}
	return out
}

// resolve returns the entry for pid. A cached process whose pidfd says it
// still runs is reused as it is; otherwise the start time is read, and the
// cached entry is reused while it says the same process.
func (r *ProcResolver) resolve(pid uint32, old map[uint32]cacheEntry, exited bool) cacheEntry {
	prev, known := old[pid]
	if known && prev.pidfd >= 0 && !exited {
		return prev
	}
	start, err := StartTime(r.procPath, pid)
	if err != nil {
		r.logReadError(pid, "stat", err, known && prev.failed)
		return cacheEntry{info: Info{PID: pid}, failed: true, gone: errors.Is(err, fs.ErrNotExist), pidfd: -1}
	}
	if known && !prev.failed && prev.info.StartTime == start {
		// The same process (a zombie, whose pidfd reads as exited, or
		// one without a pidfd yet).
		if prev.pidfd < 0 {
			prev.pidfd = r.open(pid, start)
		}
		return prev
	}
	info, err := r.read(pid, start)
	if err != nil {
		r.logReadError(pid, "details", err, known && prev.failed)
		return cacheEntry{info: Info{PID: pid}, failed: true, gone: errors.Is(err, fs.ErrNotExist), pidfd: -1}
	}
	return cacheEntry{info: info, pidfd: r.open(pid, start)}
}

// open returns a pidfd of the process pid that started at start, or -1.
// The start time is read again after the pidfd is opened: the same start
// time before and after means the pid named that process throughout, so
// the pidfd names it.
func (r *ProcResolver) open(pid uint32, start uint64) int {
	if !r.watch || r.openFDs >= r.maxFDs {
		return -1
	}
	fd, unsupported, err := openPidfd(pid)
	if err != nil {
		if unsupported {
			level.Info(r.logger).Log("msg", "no pidfds here; processes are checked through /proc at every poll", "err", err)
			r.watch = false
		}
		return -1
	}
	if again, err := StartTime(r.procPath, pid); err != nil || again != start {
		closePidfd(fd)
		return -1
	}
	r.openFDs++
	return fd
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

// Lookup returns the cached Info of pid; it never reads /proc. ok reports whether pid was in the last
// Refresh; a pid whose /proc entry could not be read then has an Info with
// only PID set. Pod, namespace and container names come from the
// PodLookup at lookup time, so they appear as soon as it knows them.
//
// The container is named only when the status of the process's pod lists
// its container ID. Where the PodLookup knows the container as another
// pod's (or as a pod's, for a process in no pod), the cgroup contradicts
// the API server: neither the pod nor the container is named, and the
// IDs alone are exported.
func (r *ProcResolver) Lookup(pid uint32) (Info, bool) {
	e, ok := (*r.cache.Load())[pid]
	if !ok {
		return Info{}, false
	}
	info := e.info
	if r.pods == nil {
		return info, true
	}
	if info.ContainerID != "" {
		owner, name, known := r.pods.Container(info.ContainerID)
		switch {
		case !known: // not in the pod's status yet
		case owner == info.PodUID:
			info.Container = name
		default:
			return info, true
		}
	}
	if info.PodUID != "" {
		info.Namespace, info.Pod, _ = r.pods.Pod(info.PodUID)
	}
	return info, true
}
