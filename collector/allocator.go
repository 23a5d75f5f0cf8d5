package collector

import (
	"github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
)

func init() {
	registerCollector("allocator", true, newAllocatorCollector)
}

type allocatorCollector struct {
	reserved, active, inactive, allocated, split     *family
	peakReserved, peakActive, limit, floor, capacity *family
	retries, ooms, lastOOMRequest, lastOOMTime, last *family
	timeToOOM                                        *family
}

func newAllocatorCollector(src Sources, _ log.Logger) (Collector, error) {
	if src.Join.Allocator == nil {
		return nil, nil
	}
	d := func(name, help string) *family {
		return newFamily(prometheus.BuildFQName(namespace, "allocator", name), help, prometheus.GaugeValue, processSchema)
	}
	counter := func(name, help string) *family {
		return newFamily(prometheus.BuildFQName(namespace, "allocator", name), help, prometheus.CounterValue, processSchema)
	}
	return &allocatorCollector{
		reserved:       d("reserved_bytes", "Memory the framework's caching allocator holds from the device (active + inactive)."),
		active:         d("active_bytes", "Allocator memory in active blocks (live tensors)."),
		inactive:       d("inactive_bytes", "Allocator memory cached in blocks no tensor uses (reserved - active)."),
		allocated:      d("allocated_bytes", "Allocator memory allocated to tensors (<= active)."),
		split:          d("inactive_split_bytes", "Inactive memory in split segments, which empty_cache() cannot return."),
		peakReserved:   d("peak_reserved_bytes", "The framework's peak of reserved memory."),
		peakActive:     d("peak_active_bytes", "The framework's peak of active memory."),
		limit:          d("limit_bytes", "The process's memory limit, where one is set."),
		capacity:       d("capacity_bytes", "What the allocator can reserve at most: what it reserves plus the GPU's free memory, or its limit where that is smaller."),
		floor:          d("active_floor_bytes", "The least active memory the process reported over the last 2 minutes: the floor of its training steps."),
		retries:        counter("alloc_retries_total", "Times the allocator flushed its cache and retried cudaMalloc."),
		ooms:           counter("ooms_total", "Out-of-memory errors the allocator raised."),
		lastOOMRequest: d("last_oom_request_bytes", "Bytes the last failed allocation asked for."),
		lastOOMTime:    d("last_oom_timestamp_seconds", "When the last out-of-memory event was reported."),
		last:           d("last_report_timestamp_seconds", "When the process last reported its allocator state."),
		timeToOOM:      d("time_to_oom_seconds", "The daemon's estimate of the seconds until the process runs out of memory: from its active memory over the last 30 s to 5 min (on the samples' clock), the steady climb of its floor with its peak (a leak) or, over 5 min, of its steps' typical peak over a flat floor (a growing batch), the time for the peak to reach the capacity (gpumem_allocator_capacity_bytes) at that rate. Present only while such a climb is measured."),
	}, nil
}

func (c *allocatorCollector) Update(sc *Scrape, ch chan<- prometheus.Metric) error {
	return updateRows(c, sc, ch)
}

// rows are the rows with allocator state.
func (c *allocatorCollector) rows(sc *Scrape) (*rowSet, error) {
	v := sc.View()
	if v.Snapshot == nil || len(v.Snapshot.Devices) == 0 {
		return nil, ErrNoData // no device to label a report with
	}
	all := sc.Rows()
	var rows []int // of all, those with allocator state
	for i := range all {
		if all[i].Alloc != nil {
			rows = append(rows, i)
		}
	}
	row := func(i int) *attribution.Row { return &all[rows[i]] }
	free := make(map[string]uint64, len(v.Snapshot.Devices)) // by uuid, where known
	for _, d := range v.Snapshot.Devices {
		if d.ExportsMemory() && d.HasMemory {
			free[d.UUID] = d.Memory.Free
		}
	}
	value := func(f func(a *allocstats.DeviceStats) (float64, bool)) func(i int) (float64, bool) {
		return func(i int) (float64, bool) { return f(row(i).Alloc) }
	}
	optional := func(f func(a *allocstats.DeviceStats) allocstats.Optional) func(i int) (float64, bool) {
		return value(func(a *allocstats.DeviceStats) (float64, bool) {
			o := f(a)
			return float64(o.V), o.OK
		})
	}
	return &rowSet{
		n:      len(rows),
		labels: processLabels(row, sc.src.Node),
		columns: []column{
			// An exited process (kept for the OOM linger) holds no memory:
			// only its counters and last OOM are exported.
			{c.reserved, func(i int) (float64, bool) { return float64(row(i).Alloc.Reserved), !row(i).Exited }},
			{c.active, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.Active })},
			{c.inactive, value(func(a *allocstats.DeviceStats) (float64, bool) { return float64(a.Inactive()), a.Active.OK })},
			{c.allocated, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.Allocated })},
			{c.split, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.InactiveSplit })},
			{c.peakReserved, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.PeakReserved })},
			{c.peakActive, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.PeakActive })},
			{c.limit, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.Limit })},
			{c.capacity, func(i int) (float64, bool) {
				f, ok := free[row(i).UUID]
				v, known := row(i).Capacity(f, ok)
				return float64(v), known
			}},
			{c.floor, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.ActiveFloor })},
			{c.lastOOMRequest, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.LastOOMRequest })},
			{c.retries, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.AllocRetries })},
			{c.ooms, optional(func(a *allocstats.DeviceStats) allocstats.Optional { return a.OOMs })},
			{c.lastOOMTime, value(func(a *allocstats.DeviceStats) (float64, bool) {
				return float64(a.LastOOMTime.UnixNano()) / 1e9, !a.LastOOMTime.IsZero()
			})},
			{c.last, value(func(a *allocstats.DeviceStats) (float64, bool) {
				return float64(a.LastReport.UnixNano()) / 1e9, !a.LastReport.IsZero()
			})},
			{c.timeToOOM, func(i int) (float64, bool) { return float64(row(i).TimeToOOM.V), row(i).TimeToOOM.OK }},
		},
	}, nil
}
