// Package allocstatstest hands an allocstats store what short-lived
// clients send, for the tests of the packages that read the store.
package allocstatstest

import (
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
)

// Report is a client of process id that opens a session, says hello
// (unless framework is empty), sends one stats message at now and closes:
// the process stays in the store for the TTL from now, or until Prune
// finds it gone.
func Report(store *allocstats.Store, id allocstats.Identity, framework string, devices []allocstats.DeviceReport, now time.Time) error {
	session := store.Open(id, 0)
	defer session.Close(now)
	if framework != "" {
		if err := session.Hello(allocstats.Hello{Framework: framework}); err != nil {
			return err
		}
	}
	return session.Stats(devices, now)
}

// OOM is a client of process id that opens a session, sends one oom
// message at now and closes; it returns the event the store recorded.
func OOM(store *allocstats.Store, id allocstats.Identity, m allocstats.OOMMessage, now time.Time) (allocstats.OOMEvent, error) {
	session := store.Open(id, 0)
	defer session.Close(now)
	return session.OOM(m, now, nil)
}

// Exit tells the store at now that process pid exited, as the poller's
// Prune does when /proc no longer has it: it is kept for the linger.
func Exit(store *allocstats.Store, pid uint32, now time.Time) {
	store.Prune(now, func(p uint32, _ uint64) bool { return p != pid })
}
