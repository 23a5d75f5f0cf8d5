package allocstats

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// A connection is bound, for its whole life, to the process that opened
// it: the pid and uid the kernel gives (SO_PEERCRED) and the process's
// start time, read from /proc while that process is known to still be the
// peer. Where the kernel offers a pidfd of the peer (SO_PEERPIDFD, Linux
// 6.5), /proc is read first and the pidfd is then asked whether the
// process still runs: if it does, the pid cannot have been reused in
// between, so what /proc said is the peer's. Without a pidfd, a process
// that started after the connection was accepted, or that runs under
// another uid than the kernel recorded, is not the peer. A peer whose
// start time cannot be read is refused: it is never recorded as "unknown".

// Errors that refuse a connection.
var (
	// errPeerCredentials: the kernel cannot say who the peer is.
	errPeerCredentials = errors.New("no peer credentials")
	// errPeerGone: the peer exited, or its pid now names another process,
	// before its identity could be confirmed.
	errPeerGone = errors.New("the connecting process is gone")
)

// peer is who is at the other end of a connection.
type peer struct {
	id Identity
	// alive reports whether the process id still runs. It is called after
	// each read of the connection that brings a line (one answer covers
	// every line of that read: they were written before it); nil means
	// always.
	alive func() bool
	// release frees what alive needs (the pidfd); nil when nothing.
	release func()
	// sweep: alive is cheap (a pidfd), so the periodic check asks it too.
	sweep bool
}

func (p *peer) isAlive() bool { return p.alive == nil || p.alive() }

func (p *peer) close() {
	if p.release != nil {
		p.release()
	}
}

// procInfo is what /proc says about a process.
type procInfo struct {
	startTime uint64 // clock ticks since boot, /proc/<pid>/stat field 22
	euid      uint32 // effective uid, the second number of status's Uid: line
}

// maxProcRead bounds what is read from one /proc file.
const maxProcRead = 16 << 10

// readProcInfo reads the start time and effective uid of pid under
// procPath. A missing process gives an error matching fs.ErrNotExist.
func readProcInfo(procPath string, pid uint32) (procInfo, error) {
	stat, err := readProc(procPath, pid, "stat")
	if err != nil {
		return procInfo{}, err
	}
	start, err := statStartTime(stat)
	if err != nil {
		return procInfo{}, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
	}
	status, err := readProc(procPath, pid, "status")
	if err != nil {
		return procInfo{}, err
	}
	euid, err := statusEffectiveUID(status)
	if err != nil {
		return procInfo{}, fmt.Errorf("parsing /proc/%d/status: %w", pid, err)
	}
	return procInfo{startTime: start, euid: euid}, nil
}

func readProc(procPath string, pid uint32, name string) ([]byte, error) {
	path := filepath.Join(procPath, strconv.FormatUint(uint64(pid), 10), name)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxProcRead))
	if errors.Is(err, syscall.ESRCH) {
		// The process exited between the open and the read.
		return nil, fmt.Errorf("reading %s: %w", path, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, nil
}

// statStartTime returns field 22 of a stat line. Field 2, the command name,
// is in parentheses and may hold spaces and parentheses itself, so fields
// are counted from the last ')'.
func statStartTime(data []byte) (uint64, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, errors.New("no ')' closing the command name")
	}
	fields := bytes.Fields(data[end+1:])
	const startField = 22 - 3 // the fields after ')' start at field 3
	if len(fields) <= startField {
		return 0, fmt.Errorf("%d fields after the command name, want more than %d", len(fields), startField)
	}
	start, err := strconv.ParseUint(string(fields[startField]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("start time: %w", err)
	}
	if start == 0 {
		return 0, errors.New("start time 0")
	}
	return start, nil
}

// statusEffectiveUID returns the effective uid from a status file: the
// second number of its Uid: line (SO_PEERCRED gives the effective uid too).
func statusEffectiveUID(data []byte) (uint32, error) {
	for line := range bytes.SplitSeq(data, []byte{'\n'}) {
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		fields := bytes.Fields(rest)
		if len(fields) < 2 {
			return 0, errors.New("short Uid: line")
		}
		uid, err := strconv.ParseUint(string(fields[1]), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("effective uid: %w", err)
		}
		return uint32(uid), nil
	}
	return 0, errors.New("no Uid: line")
}

// clockTicksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's start
// time: 100 on every architecture Linux runs Go on.
const clockTicksPerSecond = 100

// identifyPeer establishes who is at the other end of c (see the comment at
// the top of this file). acceptedAt is CLOCK_BOOTTIME when c was accepted,
// for the check without a pidfd.
func (s *Server) identifyPeer(c kernelConn, acceptedAt time.Duration) (*peer, error) {
	kp, err := peerCredentials(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errPeerCredentials, err)
	}
	procPath := s.cfg.ProcPath
	return identify(kp, func(pid uint32) (procInfo, error) { return readProcInfo(procPath, pid) }, acceptedAt)
}

// identify decides who the peer kp is from what readProc says about its
// pid, read after the kernel named it.
func identify(kp kernelPeerInfo, readProc func(pid uint32) (procInfo, error), acceptedAt time.Duration) (*peer, error) {
	info, procErr := readProc(kp.pid)
	if kp.pidfd != nil {
		// After the read: if the process still runs, the pid was never
		// freed since it connected, so /proc described the peer.
		if !kp.pidfd.alive() {
			kp.pidfd.close()
			return nil, fmt.Errorf("%w: pid %d exited before its identity was read", errPeerGone, kp.pid)
		}
	}
	fail := func(err error) (*peer, error) {
		if kp.pidfd != nil {
			kp.pidfd.close()
		}
		return nil, err
	}
	switch {
	case errors.Is(procErr, fs.ErrNotExist):
		return fail(fmt.Errorf("%w: pid %d exited before its identity was read", errPeerGone, kp.pid))
	case procErr != nil:
		// The start time stays unknown: refuse rather than record a
		// process that any later holder of the pid would match.
		return fail(fmt.Errorf("%w: cannot read /proc for pid %d: %w", errPeerCredentials, kp.pid, procErr))
	case kp.pidfd == nil && info.euid != kp.uid:
		// With a pidfd the process is proven to be the peer (it may have
		// changed its uid since it connected); without one, another uid
		// means another process.
		return fail(fmt.Errorf("%w: pid %d runs as uid %d, the kernel says the peer had uid %d", errPeerGone, kp.pid, info.euid, kp.uid))
	case kp.pidfd == nil && acceptedAt > 0 && time.Duration(info.startTime)*time.Second/clockTicksPerSecond > acceptedAt+time.Second/clockTicksPerSecond:
		return fail(fmt.Errorf("%w: pid %d started after the connection was accepted: the pid was reused", errPeerGone, kp.pid))
	}
	id := Identity{PID: kp.pid, UID: kp.uid, StartTime: info.startTime}
	p := &peer{id: id}
	if fd := kp.pidfd; fd != nil {
		p.alive, p.release, p.sweep = fd.alive, fd.close, true
	} else {
		p.alive = func() bool {
			now, err := readProc(id.PID)
			return err == nil && now.startTime == id.StartTime && now.euid == id.UID
		}
	}
	return p, nil
}
