package allocstats

import (
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// Version lets a reader skip a join while it says nothing changed (the
// OOM reports' observe cache does): every change to what Processes
// returns, Connected aside, must raise it. The store is driven through
// random messages, connections closing, prunes, removals and NVML
// listings; after each step whose Processes differ from the last, Version
// must differ too.
func TestVersionRaisedByEveryChangeToProcesses(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := NewStore(2 * time.Second)
	s.SetLinger(3 * time.Second)
	now := time.Unix(1_700_000_000, 0)
	uuids := []string{testUUID, testUUID2}
	opt := func() Optional {
		if rng.IntN(3) == 0 {
			return Optional{}
		}
		return Some(rng.Uint64N(8))
	}
	type conn struct {
		id    Identity
		entry *procEntry
	}
	var conns []*conn
	alive := map[uint32]uint64{} // pid: start time of the live process
	view := func() []Process {
		ps := s.Processes()
		for i := range ps {
			ps[i].Connected = false
		}
		return ps
	}
	last, lastVersion := view(), s.Version()
	for step := 0; step < 5000; step++ {
		now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		var what string
		switch op := rng.IntN(10); {
		case op == 0 || len(conns) == 0:
			pid := uint32(1 + rng.IntN(4))
			start, ok := alive[pid]
			if !ok || rng.IntN(4) == 0 {
				start = uint64(1 + rng.IntN(1000))
				alive[pid] = start
			}
			conns = append(conns, &conn{id: Identity{PID: pid, UID: 1000, StartTime: start}})
			what = fmt.Sprintf("connection of pid %d", pid)
		case op == 1:
			i := rng.IntN(len(conns))
			s.release(conns[i].entry, now)
			conns = append(conns[:i], conns[i+1:]...)
			what = "connection closed"
		case op == 2:
			c := conns[rng.IntN(len(conns))]
			c.entry, _ = s.hello(c.entry, c.id, wire.Hello{Framework: fmt.Sprint("f", rng.IntN(2)), FrameworkVersion: fmt.Sprint(rng.IntN(2)), Client: fmt.Sprint("c", rng.IntN(2))})
			what = "hello"
		case op == 3:
			c := conns[rng.IntN(len(conns))]
			m := OOMMessage{UUID: uuids[rng.IntN(2)], RequestedBytes: rng.Uint64N(8), LimitBytes: opt(), FreeBytes: opt()}
			c.entry, _, _ = s.oom(c.entry, c.id, m, now, DefaultMaxDevices, nil)
			what = "oom"
		case op == 4:
			pid := uint32(1 + rng.IntN(4))
			delete(alive, pid)
			s.Prune(now, func(pid uint32, start uint64) bool { return alive[pid] == start })
			what = fmt.Sprintf("pid %d exited, prune", pid)
		case op == 5:
			s.Prune(now, nil)
			what = "prune"
		case op == 6:
			exitProcess(s, uint32(1+rng.IntN(4)))
			what = "remove"
		case op == 7:
			unlisted := uuids[rng.IntN(2)]
			s.DropUnlisted(now, 2*time.Second, func(_ uint32, uuid string) bool { return uuid != unlisted })
			what = "NVML listing"
		default:
			c := conns[rng.IntN(len(conns))]
			var devices []DeviceReport
			for _, u := range uuids[:1+rng.IntN(2)] {
				devices = append(devices, DeviceReport{UUID: u, Reserved: rng.Uint64N(8), Active: opt(), Allocated: opt(), InactiveSplit: opt(),
					PeakReserved: opt(), PeakActive: opt(), Limit: opt(), AllocRetries: opt(), OOMs: opt()})
			}
			c.entry, _ = s.stats(c.entry, c.id, devices, now, DefaultMaxDevices)
			what = "stats"
		}
		got, version := view(), s.Version()
		if !reflect.DeepEqual(got, last) && version == lastVersion {
			t.Fatalf("step %d (%s) changed Processes but not Version %d:\nbefore %+v\nafter  %+v", step, what, version, last, got)
		}
		last, lastVersion = got, version
	}
}
