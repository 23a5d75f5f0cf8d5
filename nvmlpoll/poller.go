package nvmlpoll

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/internal/tick"
)

// notAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
const notAvailable = ^uint64(0)

// Config configures a Poller.
type Config struct {
	// Lib is the NVML library: nvml.New() for a real GPU, a mock or the
	// simulator otherwise. The poller calls Init on it.
	Lib      nvml.Interface
	Interval time.Duration
	Logger   log.Logger
	// InitBackoffMin and InitBackoffMax bound the retry delay while NVML
	// cannot be initialised. Defaults 1s and 1m.
	InitBackoffMin, InitBackoffMax time.Duration
	// IdentityRefresh is how often the devices' identity (handles, UUIDs,
	// names, PCI bus IDs, MIG modes and MIG instances) is read again
	// although no call failed: it does not change while the driver is
	// loaded, except that MIG instances can be created and destroyed.
	// Default 1m.
	IdentityRefresh time.Duration
	// ProcessRefresh bounds how long a device's process lists are reused.
	// Between two reads a poll reads only the device's memory figures and
	// reuses the lists while those figures are what they were when the
	// lists were read (a process that starts, exits, allocates or frees
	// device memory changes them); at least every ProcessRefresh, on every
	// poll that Fresh asks for, and after any failed call the lists are read
	// again. 0 reads them at every poll.
	ProcessRefresh time.Duration
	Now            func() time.Time
}

// Poller polls NVML in one goroutine and publishes immutable snapshots.
// Scrapes read Snapshot() and never call NVML.
type Poller struct {
	cfg    Config
	logger log.Logger

	snapshot atomic.Pointer[Snapshot]
	up       atomic.Bool
	ready    atomic.Bool
	polled   atomic.Bool

	// hooks run in the poll goroutine after each published snapshot
	// (OnPoll).
	hooks []func(*Snapshot)

	// Owned by the poll goroutine.
	initialised bool
	driver      string
	cudaDriver  string
	peaks       map[peakKey]uint64
	names       map[uint32]string
	useV1       map[string]bool
	reported    map[string]bool
	ids         identities
	lists       map[string]*processLists // by device UUID
	pollGen     uint64                   // polls run, marks the lists a poll used
	pollTime    time.Time                // the current poll's time
	readLists   bool                     // the current poll reads every process list
	// pollErrors counts the failed NVML calls of the current poll; any
	// failure makes the next poll read the identities again.
	pollErrors int

	pollDuration prometheus.Histogram
	errors       *prometheus.CounterVec
	upDesc       *prometheus.Desc

	// Fresh's bookkeeping: polls started and finished, and a channel that
	// wakes Run for an early poll.
	kick              chan struct{}
	genMu             sync.Mutex
	genCond           *sync.Cond
	started, finished uint64
	forceLists        bool // under genMu: the next poll to start reads every process list
}

// processLists are a device's merged process lists as last read, with the
// memory figures read just before them.
type processLists struct {
	memory Memory
	read   time.Time
	procs  []Process // never handed out: a poll copies them
	gen    uint64    // the last poll that used them
}

type peakKey struct {
	uuid string
	pid  uint32
}

// NewPoller returns a poller; call Run to start it.
func NewPoller(cfg Config) *Poller {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = log.NewNopLogger()
	}
	if cfg.InitBackoffMin <= 0 {
		cfg.InitBackoffMin = time.Second
	}
	if cfg.InitBackoffMax <= 0 {
		cfg.InitBackoffMax = time.Minute
	}
	if cfg.IdentityRefresh <= 0 {
		cfg.IdentityRefresh = time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Poller{
		cfg:      cfg,
		logger:   cfg.Logger,
		peaks:    make(map[peakKey]uint64),
		names:    make(map[uint32]string),
		useV1:    make(map[string]bool),
		reported: make(map[string]bool),
		lists:    make(map[string]*processLists),
		pollDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpumem_nvml_poll_duration_seconds",
			Help:    "Time one NVML poll of every device took.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpumem_nvml_errors_total",
			Help: "NVML calls that failed, by call.",
		}, []string{"call"}),
		upDesc: prometheus.NewDesc("gpumem_nvml_up", "1 when NVML is initialised and the last poll listed the devices and is recent (within 3 poll intervals and 5 s), else 0.", nil, nil),
	}
	p.kick = make(chan struct{}, 1)
	p.genCond = sync.NewCond(&p.genMu)
	// The calls every poll makes start at 0, so that a rate() of the first
	// failure is not lost.
	for _, call := range []string{"Init", "DeviceGetCount", "GetUUID", "GetMemoryInfo_v2", "GetMemoryInfo", "GetComputeRunningProcesses", "GetGraphicsRunningProcesses"} {
		p.errors.WithLabelValues(call)
	}
	return p
}

// Snapshot returns the latest snapshot, or nil before the first poll.
func (p *Poller) Snapshot() *Snapshot { return p.snapshot.Load() }

// Up reports whether NVML answered the last poll, and that poll is recent:
// a poll stuck in an NVML call (a GPU falling off the bus can do that)
// leaves the last snapshot in place, and Up turns false after StaleAfter.
func (p *Poller) Up() bool {
	if !p.up.Load() {
		return false
	}
	snap := p.snapshot.Load()
	return snap != nil && p.cfg.Now().Sub(snap.Time) <= p.StaleAfter()
}

// StaleAfter is how old the last snapshot may be before NVML counts as
// down: three poll intervals and five seconds.
func (p *Poller) StaleAfter() time.Duration { return 3*p.cfg.Interval + 5*time.Second }

// OnPoll adds f to the hooks that run in the poll goroutine after each
// published snapshot, in the order they were added (resolving pids,
// pruning exited processes). f must not block long. Add hooks before Run.
func (p *Poller) OnPoll(f func(*Snapshot)) {
	p.hooks = append(p.hooks, f)
}

// Polled reports whether a poll has been attempted and published, with
// or without success.
func (p *Poller) Polled() bool { return p.polled.Load() }

// Ready reports whether one poll has succeeded.
func (p *Poller) Ready() bool { return p.ready.Load() }

// Describe implements prometheus.Collector for NVML health metrics.
func (p *Poller) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.upDesc
	p.pollDuration.Describe(ch)
	p.errors.Describe(ch)
}

// Collect implements prometheus.Collector for NVML health metrics.
func (p *Poller) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if p.Up() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(p.upDesc, prometheus.GaugeValue, up)
	p.pollDuration.Collect(ch)
	p.errors.Collect(ch)
}

// Run initialises NVML, retrying with backoff while it cannot, then polls
// every interval, at whole multiples of it since the Unix epoch, until ctx
// is done.
func (p *Poller) Run(ctx context.Context) {
	defer p.shutdown()
	backoff := p.cfg.InitBackoffMin
	loggedInitError := false
	for ctx.Err() == nil {
		if !p.initialised {
			if err := p.init(); err != nil {
				p.up.Store(false)
				p.publish(&Snapshot{Time: p.cfg.Now()})
				if !loggedInitError {
					level.Error(p.logger).Log("msg", "NVML unavailable; serving gpumem_nvml_up 0 and retrying with backoff", "err", err)
					loggedInitError = true
				} else {
					level.Debug(p.logger).Log("msg", "NVML still unavailable", "err", err, "retry_in", backoff)
				}
				if !sleep(ctx, backoff, nil) {
					return
				}
				backoff = min(backoff*2, p.cfg.InitBackoffMax)
				continue
			}
			if loggedInitError {
				level.Info(p.logger).Log("msg", "NVML initialised after retrying")
			}
			loggedInitError = false
			backoff = p.cfg.InitBackoffMin
		}
		if err := p.Poll(); err != nil {
			level.Warn(p.logger).Log("msg", "NVML poll failed", "err", err)
		}
		// On the grid of the interval (tick.Next), which the allocator
		// socket's check shares: one wake-up for both; sooner when Fresh
		// asks for a poll.
		if !sleep(ctx, tick.Next(time.Now(), p.cfg.Interval), p.kick) {
			return
		}
	}
}

// Fresh returns a snapshot from a poll that started after the call: it
// asks the poll goroutine (Run) to poll now, or joins the poll it is about
// to start, so that on-demand reads and the regular poll are one. When no
// such poll completes before ctx ends (Run is not running, NVML hangs), it
// returns the latest snapshot and ctx's error.
func (p *Poller) Fresh(ctx context.Context) (*Snapshot, error) {
	p.genMu.Lock()
	target := p.started + 1
	p.forceLists = true // an on-demand read wants who holds the memory now
	p.genMu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default: // a poll is already asked for
	}
	stop := context.AfterFunc(ctx, func() {
		p.genMu.Lock()
		p.genCond.Broadcast()
		p.genMu.Unlock()
	})
	defer stop()
	p.genMu.Lock()
	defer p.genMu.Unlock()
	for p.finished < target {
		if ctx.Err() != nil {
			return p.Snapshot(), ctx.Err()
		}
		p.genCond.Wait()
	}
	return p.Snapshot(), nil
}

// sleep waits d, or less when wake (nil: never) has a value; false when
// ctx ends first.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	case <-wake:
		return true
	}
}

func (p *Poller) init() (err error) {
	defer recoverInto(&err, "nvmlInit")
	if ret := p.cfg.Lib.Init(); ret != nvml.SUCCESS {
		p.errors.WithLabelValues("Init").Inc()
		return fmt.Errorf("initialising NVML: %w", ret)
	}
	p.initialised = true
	p.ids = identities{} // a new driver may number and name the devices differently
	clear(p.lists)
	if v, ret := p.cfg.Lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		p.driver = v
	} else {
		p.countError("SystemGetDriverVersion", ret)
	}
	if v, ret := p.cfg.Lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		p.cudaDriver = fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
	} else {
		p.countError("SystemGetCudaDriverVersion", ret)
	}
	level.Info(p.logger).Log("msg", "NVML initialised", "driver_version", p.driver, "cuda_driver_version", p.cudaDriver)
	return nil
}

func (p *Poller) shutdown() {
	if p.initialised {
		p.cfg.Lib.Shutdown()
		p.initialised = false
	}
}

func recoverInto(err *error, call string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("NVML call %s panicked: %v", call, r)
	}
}

func (p *Poller) countError(call string, ret nvml.Return) {
	p.pollErrors++
	p.errors.WithLabelValues(call).Inc()
	key := call + ":" + ret.Error()
	if !p.reported[key] {
		p.reported[key] = true
		level.Warn(p.logger).Log("msg", "NVML call failed; the values it returns are left out", "call", call, "err", ret.Error())
	}
}

// errLost means the driver went away; the poller initialises NVML again.
var errLost = errors.New("NVML is no longer initialised")

// Poll reads every device once and publishes a snapshot, initialising
// NVML first if needed. It runs in the poll goroutine: Run calls it, and
// a caller without Run must not call it concurrently.
func (p *Poller) Poll() (err error) {
	p.genMu.Lock()
	p.started++
	p.readLists = p.forceLists || p.cfg.ProcessRefresh <= 0
	p.forceLists = false
	p.genMu.Unlock()
	defer func() {
		p.genMu.Lock()
		p.finished++
		p.genCond.Broadcast()
		p.genMu.Unlock()
	}()
	if !p.initialised {
		if err := p.init(); err != nil {
			p.up.Store(false)
			return err
		}
	}
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			p.errors.WithLabelValues("poll").Inc()
			p.up.Store(false)
			err = fmt.Errorf("NVML poll panicked: %v", r)
		}
	}()
	snap, err := p.poll()
	p.pollDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		p.up.Store(false)
		p.publish(&Snapshot{Time: p.cfg.Now()})
		if errors.Is(err, errLost) {
			p.shutdown()
		}
		return err
	}
	p.up.Store(true)
	p.publish(snap)
	p.ready.Store(true)
	return nil
}

func (p *Poller) publish(s *Snapshot) {
	p.polled.Store(true)
	p.snapshot.Store(s)
	for _, hook := range p.hooks {
		hook(s)
	}
}

func (p *Poller) poll() (*Snapshot, error) {
	p.pollErrors = 0
	count, ret := p.cfg.Lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		p.countError("DeviceGetCount", ret)
		if ret == nvml.ERROR_UNINITIALIZED || ret == nvml.ERROR_DRIVER_NOT_LOADED || ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, fmt.Errorf("counting devices: %w: %w", ret, errLost)
		}
		return nil, fmt.Errorf("counting devices: %w", ret)
	}
	now := p.cfg.Now()
	if p.ids.stale || p.ids.count != count || now.Sub(p.ids.read) >= p.cfg.IdentityRefresh {
		p.readIdentities(count, now)
		p.readLists = true
	}
	p.pollGen++
	p.pollTime = now
	snap := &Snapshot{
		Time:              now,
		DriverVersion:     p.driver,
		CUDADriverVersion: p.cudaDriver,
		Devices:           make([]Device, 0, p.ids.devices),
	}
	seenPeaks := make(map[peakKey]struct{}, len(p.peaks))
	seenPIDs := make(map[uint32]struct{}, len(p.names))
	for i := range p.ids.gpus {
		id := &p.ids.gpus[i]
		d := id.dev
		if d.MIGMode != MIGEnabled {
			p.fillMemoryAndProcesses(id.handle, &d, seenPeaks, seenPIDs)
			snap.Devices = append(snap.Devices, d)
			continue
		}
		snap.Devices = append(snap.Devices, d)
		for j := range id.migs {
			m := &id.migs[j]
			md := m.dev
			p.fillMemoryAndProcesses(m.handle, &md, seenPeaks, seenPIDs)
			snap.Devices = append(snap.Devices, md)
		}
	}
	for k := range p.peaks {
		if _, ok := seenPeaks[k]; !ok {
			delete(p.peaks, k)
		}
	}
	for pid := range p.names {
		if _, ok := seenPIDs[pid]; !ok {
			delete(p.names, pid)
		}
	}
	for uuid, l := range p.lists {
		if l.gen != p.pollGen || p.pollErrors > 0 {
			delete(p.lists, uuid) // a device gone, or a call failed: read again
		}
	}
	if p.pollErrors > 0 {
		// A failed call may mean a handle that no longer names the device
		// (a GPU reset, a MIG instance destroyed): read them again.
		p.ids.stale = true
	}
	return snap, nil
}

// identities are the devices as the last identity read found them. A
// poll reads only memory and process lists with the cached handles; the
// identity is read again after a failed call, a re-initialisation of NVML,
// a change in the device count, or Config.IdentityRefresh.
type identities struct {
	gpus    []gpuIdentity
	count   int       // DeviceGetCount when read
	devices int       // devices in a snapshot: GPUs and MIG instances
	read    time.Time // when read
	stale   bool      // read again at the next poll
}

type gpuIdentity struct {
	handle nvml.Device
	dev    Device // the identity fields only
	migs   []migIdentity
}

type migIdentity struct {
	handle nvml.Device
	dev    Device
}

// readIdentities reads every device's handle, UUID, name, PCI bus ID and
// MIG mode, and the MIG instances of GPUs in MIG mode. A device that
// cannot be read is left out until the next read, which a failed call
// makes the next poll's.
func (p *Poller) readIdentities(count int, now time.Time) {
	before := p.pollErrors
	ids := identities{count: count, read: now, gpus: make([]gpuIdentity, 0, count)}
	for i := 0; i < count; i++ {
		dev, ret := p.cfg.Lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			p.countError("DeviceGetHandleByIndex", ret)
			continue
		}
		d, ok := p.readDevice(dev, i, "")
		if !ok {
			continue
		}
		d.MIGMode = p.migMode(dev)
		g := gpuIdentity{handle: dev, dev: d}
		if d.MIGMode == MIGEnabled {
			g.migs = p.readMIGDevices(dev, d)
		}
		ids.devices += 1 + len(g.migs)
		ids.gpus = append(ids.gpus, g)
	}
	ids.stale = p.pollErrors > before
	p.ids = ids
}

// readDevice reads a device's identity. Without a UUID the device cannot be
// labelled and is skipped.
func (p *Poller) readDevice(dev nvml.Device, index int, parentUUID string) (Device, bool) {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		p.countError("GetUUID", ret)
		return Device{}, false
	}
	d := Device{Index: index, UUID: uuid, ParentUUID: parentUUID}
	if name, ret := dev.GetName(); ret == nvml.SUCCESS {
		d.Name = name
	} else {
		p.countError("GetName", ret)
	}
	if parentUUID == "" {
		if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
			d.PCIBusID = busID(pci)
		} else {
			p.countError("GetPciInfo", ret)
		}
	}
	return d, true
}

func busID(pci nvml.PciInfo) string {
	b := make([]byte, 0, len(pci.BusId))
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if len(b) == 0 {
		return fmt.Sprintf("%08x:%02x:%02x.0", pci.Domain, pci.Bus, pci.Device)
	}
	return string(b)
}

func (p *Poller) migMode(dev nvml.Device) string {
	current, _, ret := dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return MIGUnsupported
	case ret != nvml.SUCCESS:
		p.countError("GetMigMode", ret)
		return MIGUnsupported
	case current == nvml.DEVICE_MIG_ENABLE:
		return MIGEnabled
	default:
		return MIGDisabled
	}
}

func (p *Poller) readMIGDevices(dev nvml.Device, parent Device) []migIdentity {
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		p.countError("GetMaxMigDeviceCount", ret)
		return nil
	}
	var out []migIdentity
	for j := 0; j < max; j++ {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no instance in this slot
		}
		if ret != nvml.SUCCESS {
			p.countError("GetMigDeviceHandleByIndex", ret)
			continue
		}
		d, ok := p.readDevice(mig, parent.Index, parent.UUID)
		if !ok {
			continue
		}
		d.PCIBusID = parent.PCIBusID
		out = append(out, migIdentity{handle: mig, dev: d})
	}
	return out
}

func (p *Poller) fillMemoryAndProcesses(dev nvml.Device, d *Device, seenPeaks map[peakKey]struct{}, seenPIDs map[uint32]struct{}) {
	d.Memory, d.HasMemory = p.memory(dev, d.UUID)
	procs, ok := p.deviceProcesses(dev, d)
	d.HasProcesses = ok
	for i := range procs {
		pr := &procs[i]
		seenPIDs[pr.PID] = struct{}{}
		key := peakKey{d.UUID, pr.PID}
		seenPeaks[key] = struct{}{}
		if pr.HasUsed && pr.UsedBytes > p.peaks[key] {
			p.peaks[key] = pr.UsedBytes
		}
		pr.PeakBytes = p.peaks[key]
		pr.Name = p.processName(pr.PID)
	}
	d.Processes = procs
}

func (p *Poller) memory(dev nvml.Device, uuid string) (Memory, bool) {
	if !p.useV1[uuid] {
		m, ret := dev.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			return Memory{Total: m.Total, Free: m.Free, Used: m.Used, Reserved: m.Reserved, HasReserved: true}, true
		case nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_ARGUMENT_VERSION_MISMATCH:
			p.useV1[uuid] = true
			level.Info(p.logger).Log("msg", "NVML memory info v2 unavailable; using v1, where used includes the driver's reservation", "uuid", uuid, "err", ret.Error())
		default:
			p.countError("GetMemoryInfo_v2", ret)
			return Memory{}, false
		}
	}
	m, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		p.countError("GetMemoryInfo", ret)
		return Memory{}, false
	}
	return Memory{Total: m.Total, Free: m.Free, Used: m.Used}, true
}

// deviceProcesses returns d's process lists: the last ones read, when
// Config.ProcessRefresh lets them be reused (see there), else read now.
// The slice is the caller's to change.
func (p *Poller) deviceProcesses(dev nvml.Device, d *Device) ([]Process, bool) {
	l := p.lists[d.UUID]
	if l != nil && !p.readLists && d.HasMemory && d.Memory == l.memory && p.pollTime.Sub(l.read) < p.cfg.ProcessRefresh {
		l.gen = p.pollGen
		return slices.Clone(l.procs), true
	}
	procs, ok := p.processes(dev)
	if !ok || !d.HasMemory || p.cfg.ProcessRefresh <= 0 {
		delete(p.lists, d.UUID)
		return procs, ok
	}
	if l == nil {
		l = &processLists{}
		p.lists[d.UUID] = l
	}
	l.memory, l.read, l.gen = d.Memory, p.pollTime, p.pollGen
	l.procs = append(l.procs[:0], procs...)
	return procs, true
}

// processes merges the compute and graphics lists. It fails only when
// neither list could be read.
func (p *Poller) processes(dev nvml.Device) ([]Process, bool) {
	compute, cret := dev.GetComputeRunningProcesses()
	if cret != nvml.SUCCESS {
		p.countError("GetComputeRunningProcesses", cret)
		compute = nil
	}
	graphics, gret := dev.GetGraphicsRunningProcesses()
	if gret != nvml.SUCCESS {
		// Graphics lists are unsupported on many data-centre configurations
		// (MIG instances among them): count it only when it matters.
		if gret != nvml.ERROR_NOT_SUPPORTED || cret != nvml.SUCCESS {
			p.countError("GetGraphicsRunningProcesses", gret)
		}
		graphics = nil
	}
	if cret != nvml.SUCCESS && gret != nvml.SUCCESS {
		return nil, false
	}
	// One record per entry, sorted by pid, then the entries of one pid
	// (in both lists, or listed twice) merged.
	out := make([]Process, 0, len(compute)+len(graphics))
	for _, list := range []struct {
		infos   []nvml.ProcessInfo
		compute bool
	}{{compute, true}, {graphics, false}} {
		for _, info := range list.infos {
			pr := Process{PID: info.Pid, Compute: list.compute, Graphics: !list.compute}
			if info.UsedGpuMemory != notAvailable {
				pr.HasUsed, pr.UsedBytes = true, info.UsedGpuMemory
			}
			out = append(out, pr)
		}
	}
	slices.SortStableFunc(out, func(a, b Process) int { return cmp.Compare(a.PID, b.PID) })
	merged := out[:0]
	for _, pr := range out {
		if n := len(merged); n > 0 && merged[n-1].PID == pr.PID {
			m := &merged[n-1]
			m.HasUsed = m.HasUsed || pr.HasUsed
			m.UsedBytes = max(m.UsedBytes, pr.UsedBytes)
			m.Compute = m.Compute || pr.Compute
			m.Graphics = m.Graphics || pr.Graphics
			continue
		}
		merged = append(merged, pr)
	}
	return merged, true
}

// processName asks NVML once per pid; /proc/<pid>/comm is preferred by the
// collector, and this is its fallback.
func (p *Poller) processName(pid uint32) string {
	if name, ok := p.names[pid]; ok {
		return name
	}
	name, ret := p.cfg.Lib.SystemGetProcessName(int(pid))
	if ret != nvml.SUCCESS {
		name = ""
	}
	p.names[pid] = name
	return name
}
