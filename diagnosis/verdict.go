// Package diagnosis says why a process ran out of GPU memory, in the words
// of the memory model: context, active, inactive, reserved, limit, free.
// It reads the figures of one out-of-memory report (the request, the
// reporting process's allocator at the failure, the other processes on the
// device, the device's free memory) and the trend of the process's active
// memory before it, and gives a cause from a small stable set, the causes
// that contributed, the figures that decided it and the first remedy. It
// is a pure function of its input: the OOM reports build the input.
package diagnosis

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Cause is why an allocation failed. The set is stable: dashboards, alerts
// and the client's message match on it.
type Cause string

// The causes, in the order they are tried (see Diagnose).
const (
	// TooLarge: the request alone is more than the process could ever get
	// (its limit, or the GPU).
	TooLarge Cause = "too_large"
	// Fragmentation: the process's own inactive memory would cover the
	// request, but no cached block fits (it sits in split segments).
	Fragmentation Cause = "fragmentation"
	// Leak: the floor of active memory climbed before the failure.
	Leak Cause = "leak"
	// Limit: the request would take the process past its own limit (or
	// past the GPU, where it is alone) while the GPU has room.
	Limit Cause = "limit"
	// Growth: the peak of active memory climbed over a flat floor.
	Growth Cause = "growth"
	// Neighbours: the GPU's free memory was less than the request and
	// other processes hold it.
	Neighbours Cause = "neighbours"
	// Contexts: several processes each pay a context, a material share of
	// the GPU, and the contexts alone would have covered the shortfall.
	Contexts Cause = "contexts"
	// Unknown: the figures cannot tell.
	Unknown Cause = "unknown"
)

// Causes lists every cause, in a fixed order.
func Causes() []Cause {
	return []Cause{TooLarge, Fragmentation, Leak, Limit, Growth, Neighbours, Contexts, Unknown}
}

// Valid says whether c is one of Causes.
func Valid(c Cause) bool {
	for _, k := range Causes() {
		if c == k {
			return true
		}
	}
	return false
}

// Process is one process on the device, as far as it is known (nil: not
// known).
type Process struct {
	PID                       uint32
	Comm                      string
	Namespace, Pod, Container string
	Used                      *uint64 // NVML
	Context                   *uint64 // used - reserved
	Reserved                  *uint64
	Active                    *uint64
	InactiveSplit             *uint64
}

// Inactive is reserved - active, where both are known.
func (p *Process) Inactive() (uint64, bool) {
	if p.Reserved == nil || p.Active == nil {
		return 0, false
	}
	if *p.Active >= *p.Reserved {
		return 0, true
	}
	return *p.Reserved - *p.Active, true
}

// Footprint is what the process holds on the device: NVML's used, or its
// allocator's reserved where NVML's figure is missing or lags.
func (p *Process) Footprint() uint64 {
	var f uint64
	if p.Used != nil {
		f = *p.Used
	}
	if p.Reserved != nil && *p.Reserved > f {
		f = *p.Reserved
	}
	return f
}

// Input is what one out-of-memory report knows.
type Input struct {
	// Requested is the size of the allocation that failed.
	Requested uint64
	// Total is the device's memory and DriverReserved the driver's own
	// part of it (NVML); 0 when unknown.
	Total, DriverReserved uint64
	// Limit is the process's own limit where one is set
	// (set_per_process_memory_fraction), nil when none.
	Limit *uint64
	// Free is the device's free memory at the failure (as the process saw
	// it), or NVML's from the reading after; nil when unknown.
	Free *uint64
	// Self is the reporting process at the failure: its allocator's
	// figures from the stats it sent with the OOM.
	Self Process
	// Others are the other processes NVML lists on the device.
	Others []Process
	// Trend is Self's active memory over the minutes before.
	Trend Trend
	// Forecast is the daemon's last estimate of Self's time to OOM before
	// the failure, nil when no climb was measured.
	Forecast *Forecast
}

// Figures are the numbers a verdict rests on, by name (bytes in names
// ending _bytes, seconds in names ending _seconds).
type Figures map[string]uint64

// Holder is another process on the device as a neighbours or contexts
// verdict names it.
type Holder struct {
	PID       uint32  `json:"pid"`
	Comm      string  `json:"comm"`
	Namespace string  `json:"namespace,omitempty"`
	Pod       string  `json:"pod,omitempty"`
	Container string  `json:"container,omitempty"`
	Used      *uint64 `json:"used_bytes,omitempty"`
	Context   *uint64 `json:"context_bytes,omitempty"`
	Active    *uint64 `json:"active_bytes,omitempty"`
	// Inactive is the cache torch.cuda.empty_cache() in that process
	// would give back (its part outside split segments).
	Inactive *uint64 `json:"inactive_bytes,omitempty"`
}

// Verdict is why the allocation failed.
type Verdict struct {
	Cause Cause `json:"cause"`
	// Contributing are the other causes whose conditions also held, in
	// the order of Causes.
	Contributing []Cause `json:"contributing,omitempty"`
	// Summary is one sentence with the figures that decided the cause.
	Summary string `json:"summary"`
	// Remedy is what to try first.
	Remedy  string   `json:"remedy"`
	Figures Figures  `json:"figures"`
	Holders []Holder `json:"holders,omitempty"`
}

// Thresholds below which a change is not called material.
const (
	// minMaterial is the least climb of the floor or the peak that counts.
	minMaterial = 128 << 20
	// minContextShare: the contexts on a GPU are material from this share
	// of its memory.
	minContextShare = 0.05
	// minContextProcesses: contexts are a cause only with this many
	// processes on the GPU (the reporter included).
	minContextProcesses = 3
	// limitSlack: a limit within this share of the GPU is the GPU itself
	// (PyTorch passes the device's memory when no limit is set).
	limitSlack = 0.01
)

// facts are the figures of an Input, derived once.
type facts struct {
	in          Input
	allowed     uint64 // the most the allocator may reserve: limit, or the GPU
	hasAllowed  bool
	limitSet    bool
	reserved    uint64
	hasReserved bool
	inactive    uint64
	hasInactive bool
	free        uint64
	hasFree     bool
	noRoom      bool   // free < requested
	shortfall   uint64 // requested - free when noRoom
	overLimit   bool   // a limit is set and reserved + requested > it
	overshoot   uint64 // by how much the request did not fit
	others      struct {
		used, inactive, contexts uint64
		n                        int
	}
	contexts uint64 // of every process on the device
	nProcs   int
}

func derive(in Input) facts {
	f := facts{in: in}
	usable := uint64(0)
	if in.Total > in.DriverReserved {
		usable = in.Total - in.DriverReserved
	}
	if in.Limit != nil && (usable == 0 || float64(*in.Limit) < float64(usable)*(1-limitSlack)) {
		f.limitSet = true
		f.allowed, f.hasAllowed = *in.Limit, true
	} else if usable > 0 {
		f.allowed, f.hasAllowed = usable, true
		if in.Self.Context != nil && *in.Self.Context < usable {
			f.allowed = usable - *in.Self.Context
		}
	}
	if in.Self.Reserved != nil {
		f.reserved, f.hasReserved = *in.Self.Reserved, true
	}
	f.inactive, f.hasInactive = in.Self.Inactive()
	if in.Free != nil {
		f.free, f.hasFree = *in.Free, true
		if f.free < in.Requested {
			f.noRoom, f.shortfall = true, in.Requested-f.free
		}
	}
	if f.limitSet && f.hasReserved && f.reserved+in.Requested > f.allowed {
		f.overLimit = true
	}
	switch {
	case f.overLimit:
		f.overshoot = f.reserved + in.Requested - f.allowed
	case f.noRoom:
		f.overshoot = f.shortfall
	default:
		f.overshoot = in.Requested
	}
	f.nProcs = 1
	if in.Self.Context != nil {
		f.contexts = *in.Self.Context
	}
	for i := range in.Others {
		o := &in.Others[i]
		f.others.n++
		f.nProcs++
		f.others.used += o.Footprint()
		if v, ok := o.Inactive(); ok {
			f.others.inactive += v
		}
		if o.Context != nil {
			f.others.contexts += *o.Context
			f.contexts += *o.Context
		}
	}
	return f
}

// contextsMaterial: enough processes pay enough context to count.
func (f *facts) contextsMaterial() bool {
	return f.nProcs >= minContextProcesses && f.in.Total > 0 &&
		float64(f.contexts) >= minContextShare*float64(f.in.Total)
}

// Diagnose gives the verdict on in. The causes are tried in the order of
// Causes; the first whose condition holds is the cause, the others whose
// conditions hold contribute.
func Diagnose(in Input) Verdict {
	f := derive(in)
	steadily := f.growingSteadily()
	held := map[Cause]bool{
		TooLarge:      f.hasAllowed && in.Requested > f.allowed,
		Fragmentation: f.fragmented(),
		Leak:          f.leaking(),
		// Past its own limit, or alone (nearly) on a GPU without room:
		// the GPU is then its limit.
		Limit:      f.overLimit || (f.noRoom && f.hasReserved && f.others.used < f.shortfall),
		Growth:     steadily || f.jumped(),
		Neighbours: f.noRoom && f.others.n > 0 && f.others.used > 0,
		Contexts:   f.noRoom && f.contextsMaterial() && f.contexts >= f.shortfall,
	}
	cause := Unknown
	switch {
	case held[TooLarge]:
		cause = TooLarge
	case held[Leak]:
		cause = Leak
	case held[Limit] && !f.noRoom && f.jumped() && f.peaksFlatBefore():
		// Past its own limit by a step far above every earlier peak over
		// a flat floor (an evaluation without torch.no_grad(), a batch
		// much larger than the others): the limit held the workload
		// until the step grew.
		cause = Growth
	case held[Limit] && !f.noRoom:
		// Past its own limit with the GPU's room: the limit, unless the
		// request would have fitted in its own cache, with room to go on.
		cause = Limit
		if held[Fragmentation] && f.fragmentationMaterial() {
			cause = Fragmentation
		}
	case steadily:
		cause = Growth
	case held[Fragmentation] && f.fragmentationMaterial():
		cause = Fragmentation
	case f.noRoom && held[Neighbours] && f.others.inactive >= f.shortfall:
		// Cache another process could hand back covers the shortfall.
		cause = Neighbours
	case held[Contexts]:
		cause = Contexts
	case held[Neighbours]:
		cause = Neighbours
	case held[Growth]:
		cause = Growth
	case held[Limit]:
		cause = Limit
	}
	v := Verdict{Cause: cause, Figures: f.figures(cause)}
	for _, c := range Causes() {
		// A request too large for the process decides alone.
		if c != cause && held[c] && cause != TooLarge {
			v.Contributing = append(v.Contributing, c)
		}
	}
	if cause == Neighbours || cause == Contexts || held[Neighbours] {
		v.Holders = holders(in.Others)
	}
	v.Summary = f.summary(cause, v.Holders)
	v.Remedy = f.remedy(cause, v.Holders)
	return v
}

// minClimb is the least trend that can show a climb of the floor or the
// peak: a model's load, which raises active memory for up to a minute
// from a process's start, is not a leak.
const minClimb = 2 * time.Minute

// climbing says whether v never fell back by more than fallTol, rose by more
// than tol in at least two stretches, and by need in all; to the end
// asks that it also rose in the last stretch (still climbing at the
// failure: a model's load followed by flat training is not).
func climbing(v [Segments]uint64, fallTol, tol, need uint64, toTheEnd bool) bool {
	ups := 0
	for i := 1; i < Segments; i++ {
		if v[i]+fallTol < v[i-1] {
			return false
		}
		if v[i] > v[i-1]+tol {
			ups++
		}
	}
	if toTheEnd && v[Segments-1] <= v[Segments-2]+tol {
		return false
	}
	return ups >= 2 && rise(v[0], v[Segments-1]) >= need
}

// leaking: the floor of active memory climbed over the minutes before,
// by at least what the request was short of.
func (f *facts) leaking() bool {
	t := f.in.Trend
	if !t.OK() {
		return false
	}
	need := max(uint64(minMaterial), f.overshoot)
	if t.Span >= minClimb {
		return climbing(t.Floors, minMaterial/8, minMaterial/8, need, true)
	}
	// A shorter trend: a leak only when the floor rose in every stretch
	// and by much: several times where it started, or most of what the
	// process may hold. A model's load rises, then stays flat.
	for i := 1; i < Segments; i++ {
		if t.Floors[i] <= t.Floors[i-1]+minMaterial/8 {
			return false
		}
	}
	r := rise(t.Floors[0], t.Floors[Segments-1])
	much := r >= shortLeakTimes*t.Floors[0] || (f.hasAllowed && r >= f.allowed/2)
	// The request is one step's, small beside the climb: a load that
	// ends in one large allocation (a KV cache) is no leak.
	small := f.in.Requested <= r/shortLeakTimes
	return r >= need && much && small
}

// shortLeakTimes: over a trend shorter than minClimb, a floor that rose by
// this many times where it started is a leak.
const shortLeakTimes = 3

// fragmented: the process's own inactive memory would have covered the
// request.
func (f *facts) fragmented() bool {
	return f.hasInactive && f.in.Requested > 0 && f.inactive >= f.in.Requested
}

// fragmentationMaterial: the cache that did not fit would have let the
// process go on for a while: where its memory climbed, at least
// fragmentationRunway at the climb's rate beyond the request.
func (f *facts) fragmentationMaterial() bool {
	if !f.fragmented() {
		return false
	}
	if fc := f.in.Forecast; fc != nil && fc.Rate > 0 {
		return float64(f.inactive-f.in.Requested) >= fc.Rate*fragmentationRunway.Seconds()
	}
	return true
}

// fragmentationRunway: fragmentation is the cause when its cache would
// have held the climb this long beyond the failing request.
const fragmentationRunway = time.Minute

// growingSteadily: the peak climbed over the minutes before while the
// floor stayed flat: the last stretch's peak is the highest (within a
// step's few per cent of spread) and at least a fortieth above the
// first's.
func (f *facts) growingSteadily() bool {
	t := f.in.Trend
	if t.Span < minClimb {
		return false
	}
	top := t.Peak()
	last := t.Peaks[Segments-1]
	peakRise := t.PeakRise()
	return last+top/32 >= top && peakRise >= max(uint64(minMaterial), top/40) && t.FloorRise() < peakRise/4
}

// jumped: over a flat floor, the failing step asked for more than any
// step before (at least its tensors active at the failure plus the
// request): an evaluation without torch.no_grad(), a longer sequence.
func (f *facts) jumped() bool {
	t := f.in.Trend
	if !t.OK() || f.in.Self.Active == nil {
		return false
	}
	need := max(uint64(minMaterial), f.overshoot)
	demand := *f.in.Self.Active + f.in.Requested
	// Before the last stretch, which may hold the failing step itself.
	var top uint64
	for _, p := range t.Peaks[:Segments-1] {
		top = max(top, p)
	}
	jump := rise(top, demand)
	// The floor before the last stretch: the failing step may have held
	// its tensors through all of it (an evaluation of several seconds).
	floorRise := rise(t.Floors[0], t.Floors[Segments-2])
	return jump >= max(need, top/10) && floorRise < max(uint64(minMaterial), jump/4)
}

// peaksFlatBefore: the peaks of the trend before its last stretch stayed
// level (rose by less than a quarter of the failing step's jump above
// them): the workload ran steadily under its limit until the failing
// step, rather than climbing towards the limit.
func (f *facts) peaksFlatBefore() bool {
	t := f.in.Trend
	if !t.OK() || f.in.Self.Active == nil {
		return false
	}
	top, low := t.Peaks[0], t.Peaks[0]
	for _, p := range t.Peaks[:Segments-1] {
		top, low = max(top, p), min(low, p)
	}
	jump := rise(top, *f.in.Self.Active+f.in.Requested)
	return top-low < jump/4
}

func (f *facts) figures(cause Cause) Figures {
	in := f.in
	fig := Figures{"requested_bytes": in.Requested}
	put := func(name string, v *uint64) {
		if v != nil {
			fig[name] = *v
		}
	}
	if f.limitSet {
		fig["limit_bytes"] = f.allowed
	}
	if f.hasFree {
		fig["free_bytes"] = f.free
	}
	if in.Total > 0 {
		fig["total_bytes"] = in.Total
	}
	put("reserved_bytes", in.Self.Reserved)
	put("active_bytes", in.Self.Active)
	if f.hasInactive {
		fig["inactive_bytes"] = f.inactive
	}
	put("inactive_split_bytes", in.Self.InactiveSplit)
	put("context_bytes", in.Self.Context)
	if f.noRoom {
		fig["shortfall_bytes"] = f.shortfall
	}
	if f.others.n > 0 {
		fig["others_used_bytes"] = f.others.used
		fig["others_inactive_bytes"] = f.others.inactive
		fig["others_context_bytes"] = f.others.contexts
		fig["processes"] = uint64(f.nProcs)
	}
	if cause == Contexts || f.contextsMaterial() {
		fig["contexts_bytes"] = f.contexts
	}
	if fc := in.Forecast; fc != nil {
		fig["time_to_oom_seconds"] = uint64(fc.ETA.Seconds())
		fig["climb_bytes_per_minute"] = uint64(fc.Rate * 60)
	}
	if t := in.Trend; t.OK() {
		fig["trend_seconds"] = uint64(t.Span.Seconds())
		fig["floor_first_bytes"], fig["floor_last_bytes"] = t.Floors[0], t.Floors[len(t.Floors)-1]
		fig["peak_first_bytes"], fig["peak_last_bytes"] = t.Peaks[0], t.Peaks[len(t.Peaks)-1]
	}
	return fig
}

// holders are the other processes, largest footprint first.
func holders(others []Process) []Holder {
	hs := make([]Holder, 0, len(others))
	ps := make([]*Process, 0, len(others))
	for i := range others {
		ps = append(ps, &others[i])
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Footprint() > ps[j].Footprint() })
	for _, p := range ps {
		h := Holder{PID: p.PID, Comm: p.Comm, Namespace: p.Namespace, Pod: p.Pod, Container: p.Container,
			Used: p.Used, Context: p.Context, Active: p.Active}
		if v, ok := p.Inactive(); ok {
			h.Inactive = &v
		}
		hs = append(hs, h)
	}
	return hs
}

// GiB formats bytes as PyTorch's error does ("916.00 MiB", "3.56 GiB").
func GiB(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", b)
}

// Name says who a holder is: pid, and pod/container where known.
func (h Holder) Name() string {
	s := fmt.Sprintf("pid %d", h.PID)
	if h.Comm != "" {
		s += " (" + h.Comm + ")"
	}
	if h.Pod != "" {
		s += fmt.Sprintf(" in pod %s/%s", h.Namespace, h.Pod)
		if h.Container != "" {
			s += " container " + h.Container
		}
	}
	return s
}

// split describes a holder's memory as context, active and inactive.
func (h Holder) split() string {
	var parts []string
	if h.Context != nil {
		parts = append(parts, "context "+GiB(*h.Context))
	}
	if h.Active != nil {
		parts = append(parts, "active "+GiB(*h.Active))
	}
	if h.Inactive != nil {
		parts = append(parts, "inactive "+GiB(*h.Inactive))
	}
	total := ""
	if h.Used != nil {
		total = GiB(*h.Used)
	}
	switch {
	case len(parts) == 0 && total == "":
		return "an unknown amount"
	case len(parts) == 0:
		return total + " (reports no allocator figures)"
	case total == "":
		return strings.Join(parts, ", ")
	}
	return total + " (" + strings.Join(parts, ", ") + ")"
}

func (f *facts) summary(cause Cause, hs []Holder) string {
	in := f.in
	req := GiB(in.Requested)
	held := ""
	if f.hasReserved {
		held = fmt.Sprintf(" (it held %s reserved", GiB(f.reserved))
		if in.Self.Active != nil {
			held += fmt.Sprintf(": %s active, %s inactive", GiB(*in.Self.Active), GiB(f.inactive))
		}
		held += ")"
	}
	free := "an unknown amount"
	if f.hasFree {
		free = GiB(f.free)
	}
	t := in.Trend
	switch cause {
	case TooLarge:
		what := "the GPU's memory"
		if f.limitSet {
			what = "the process's limit"
		}
		return fmt.Sprintf("The request of %s alone is more than %s (%s): it could never fit.", req, what, GiB(f.allowed))
	case Fragmentation:
		split := ""
		if in.Self.InactiveSplit != nil {
			split = fmt.Sprintf(" (%s of it in split segments)", GiB(*in.Self.InactiveSplit))
		}
		return fmt.Sprintf("The process held %s inactive%s, enough for the request of %s, but no cached block fitted it, and the allocator could not reserve more%s.",
			GiB(f.inactive), split, req, f.bound())
	case Leak:
		return fmt.Sprintf("Active memory's floor climbed from %s to %s in the %s before the failure, so the request of %s no longer fitted%s.",
			GiB(t.Floors[0]), GiB(t.Floors[len(t.Floors)-1]), seconds(t), req, f.bound())
	case Limit:
		if !f.limitSet {
			return fmt.Sprintf("The request of %s would take the process past what the GPU has%s, and no other process holds enough to matter (the GPU had %s free).", req, held, free)
		}
		return fmt.Sprintf("The request of %s would take the process past its own limit of %s%s, while the GPU had %s free.", req, GiB(f.allowed), held, free)
	case Growth:
		return fmt.Sprintf("Active memory's peak climbed from %s to at least %s over a floor of about %s in the %s before the failure; the request of %s did not fit%s.",
			GiB(t.Peaks[0]), GiB(max(t.Peak(), f.demand())), GiB(t.Floors[0]), seconds(t), req, f.bound())
	case Neighbours:
		return fmt.Sprintf("The GPU had %s free, %s short of the request of %s; %s held %s%s.",
			free, GiB(f.shortfall), req, processes(f.others.n, "other process"), GiB(f.others.used), holderList(hs, 3))
	case Contexts:
		return fmt.Sprintf("The GPU had %s free, %s short of the request of %s; its %d processes each pay a fixed context, %s in all, more than the shortfall.",
			free, GiB(f.shortfall), req, f.nProcs, GiB(f.contexts))
	}
	return fmt.Sprintf("The figures cannot tell: the request of %s failed%s with %s free on the GPU and no limit exceeded as reported; the memory may have been taken and given back between the failure and the reading.", req, held, free)
}

// bound says what the allocator ran into.
func (f *facts) bound() string {
	switch {
	case f.limitSet:
		return fmt.Sprintf(" under its limit of %s", GiB(f.allowed))
	case f.hasFree:
		return fmt.Sprintf(" with %s free on the GPU", GiB(f.free))
	}
	return ""
}

func (f *facts) demand() uint64 {
	if f.in.Self.Active == nil {
		return 0
	}
	return *f.in.Self.Active + f.in.Requested
}

func seconds(t Trend) string {
	s := int(t.Span.Seconds())
	if s >= 120 {
		return fmt.Sprintf("%d minutes", s/60)
	}
	return fmt.Sprintf("%d s", s)
}

func processes(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ses", n, what)
}

// holderList names the n largest holders with their split.
func holderList(hs []Holder, n int) string {
	if len(hs) == 0 {
		return ""
	}
	var parts []string
	for i, h := range hs {
		if i == n {
			parts = append(parts, fmt.Sprintf("and %d more", len(hs)-n))
			break
		}
		parts = append(parts, h.Name()+" "+h.split())
	}
	return ": " + strings.Join(parts, "; ")
}

// RemedyOf is the first remedy for a climb of cause Leak or Growth, as a
// verdict and the daemon's warning before the failure give it.
func RemedyOf(cause Cause) string {
	if cause == Growth {
		return "Bound the batch or sequence length, and run evaluation under torch.no_grad()."
	}
	return "Find what keeps tensors from step to step: a list of outputs or losses, a loss summed without .item(), a graph kept alive."
}

func (f *facts) remedy(cause Cause, hs []Holder) string {
	switch cause {
	case TooLarge:
		return "The batch or the model is too large for this GPU from the start: lower the batch size, shard the model, or use a GPU with more memory."
	case Fragmentation:
		return "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or use fewer distinct tensor sizes (pad batches to a few fixed shapes)."
	case Leak, Growth:
		return RemedyOf(cause)
	case Limit:
		if !f.limitSet {
			return "Lower the batch size (or the sequence length); the process needs more than the GPU has."
		}
		return "Raise the limit (torch.cuda.set_per_process_memory_fraction) or lower the batch size."
	case Neighbours:
		var best *Holder
		for i := range hs {
			if hs[i].Inactive != nil && (best == nil || *hs[i].Inactive > *best.Inactive) {
				best = &hs[i]
			}
		}
		if best != nil && *best.Inactive >= minMaterial {
			give := fmt.Sprintf("torch.cuda.empty_cache() in %s would give back up to %s of inactive cache", best.Name(), GiB(*best.Inactive))
			switch {
			case *best.Inactive >= f.shortfall:
				return "Other processes hold the GPU: " + give + "; or run this job where the GPU has room."
			case f.others.inactive >= f.shortfall:
				// Only the cache of several of them together covers it.
				return fmt.Sprintf("Other processes hold the GPU: %s, not enough alone for the %s the request was short; with empty_cache() in the others too, they would give back up to %s; or run this job where the GPU has room.",
					give, GiB(f.shortfall), GiB(f.others.inactive))
			}
			return fmt.Sprintf("Other processes hold the GPU: %s, not enough for the %s the request was short, and no other process's cache makes up the rest: run this job where the GPU has room, or after they finish, or lower its batch size.",
				give, GiB(f.shortfall))
		}
		return "Other processes hold the GPU in live tensors and contexts: run this job where the GPU has room, or after they finish."
	case Contexts:
		return "Run fewer processes on this GPU (each pays its own context), or serve several models from one process."
	}
	return "Look at every process on the GPU at the time in /api/v1/oom-reports."
}
