package allocstats

// observeOOM is a test's OOM observer: it hands each event to its func.
type observeOOM func(OOMEvent)

// ObserveOOM implements OOMObserver.
func (f observeOOM) ObserveOOM(ev OOMEvent) { f(ev) }
