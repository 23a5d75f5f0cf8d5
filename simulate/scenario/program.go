package scenario

import (
	"math"
	"math/rand/v2"
	"time"
)

// Workload kinds: what a process runs. Each is also the name of a scenario
// that runs it on every GPU of the node (Names).
const (
	// Steady is training whose memory is the same step after step (the
	// seed's "code B"): a flat sawtooth, no retries, no OOM.
	Steady = "steady"
	// Leak is the seed's list-append leak: each step's output is kept in a
	// list, so active memory's floor climbs step after step until the
	// process dies of an OOM, 5 to 30 minutes after it started.
	Leak = "leak"
	// EvalNoGrad is steady training whose evaluation runs without
	// torch.no_grad(): the last evaluation batch's graph stays referenced,
	// a step up of active memory that stays. No OOM.
	EvalNoGrad = "eval-no-grad"
	// Growth is training whose batches grow (a longer sequence, a larger
	// batch): the step's peak climbs, the allocator flushes its cache and
	// retries more and more, and the process dies of an OOM 8 to 30
	// minutes after it started.
	Growth = "growth"
	// Fragmentation is training on batches of very different sizes: high
	// inactive_split, a retry now and then when a large batch finds no
	// block that fits, no OOM.
	Fragmentation = "fragmentation"
	// Spike is an inference server that now and then gets one request
	// larger than all its headroom: an OOM without any warning, caught by
	// the server, which lives on.
	Spike = "spike"
	// CacheHeavy is an idle notebook that keeps a large inactive cache from
	// an earlier big batch. Healthy.
	CacheHeavy = "cache-heavy"
	// MultiRank is a job of several ranks in one pod, one per GPU, in
	// lockstep; rank 0 gathers every step's outputs (a leak) and dies of an
	// OOM, and the pod restarts all of them.
	MultiRank = "multi-rank"
	// NVMLOnly is a process that reports no allocator statistics (not
	// instrumented): NVML lists it and its used memory, nothing more.
	NVMLOnly = "nvml-only"
)

// step is one step of a program: active memory goes from floor up to peak
// and back within length. request is the size of the allocation that
// fails if the allocator cannot reserve for peak.
type step struct {
	floor, peak uint64
	length      time.Duration
	request     uint64
}

// program is what one process runs: how each of its steps uses memory.
type program struct {
	kind    string
	rng     *rand.Rand
	timing  *rand.Rand // step lengths: the same for every rank of a job
	context uint64
	limit   uint64

	loadSteps, loaded int
	weights           uint64 // the floor once loaded
	warmCache         uint64 // a warm-up batch run once after loading
	period            time.Duration
	periodJitter      float64 // relative spread of a step's length
	stallP            float64 // chance that a step stalls (logging, a slow batch)
	amp               float64 // a step's activations, peak - floor
	jitter            float64 // a step's relative spread of activations

	trainStart time.Duration
	steps      int

	leakPerStep uint64

	// Growth: activations grow by growStep every growEvery.
	growStep  float64
	growEvery time.Duration
	grown     float64

	// Fragmentation: now and then a much larger batch.
	bigP, bigX float64

	// Evaluation without no_grad.
	evalEvery, evalLen time.Duration
	evalAmp            float64
	evalKeep           uint64
	nextEval, evalEnd  time.Duration
	kept               uint64

	// Spikes: one request larger than all headroom.
	spikeMin, spikeMax time.Duration
	nextSpike          time.Duration
}

// between draws uniformly from [lo, hi).
func between(r *rand.Rand, lo, hi float64) float64 { return lo + (hi-lo)*r.Float64() }

func durationBetween(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// newProgram draws p's program for a job that may plan on capacity bytes
// of its GPU. Draws that ranks of one job share come from shared, the rest
// from p's own generator.
func newProgram(p *proc, capacity uint64, shared uint64) *program {
	r := p.rng
	job := rand.New(rand.NewPCG(shared, 0)) // the same for every rank
	g := &program{kind: p.Kind, rng: r, timing: rand.New(rand.NewPCG(shared, 1<<32))}

	// Context: the CUDA context plus cuBLAS workspaces (220-254 MiB were
	// measured beside the 520 MiB), plus NCCL's buffers for a multi-rank job.
	g.context = CUDAContextBytes + pageUp(uint64(between(r, 0, 256)*MiB))
	if p.Kind == MultiRank {
		g.context += pageUp(uint64(between(r, 256, 768) * MiB))
	}
	g.loadSteps = 10 + job.IntN(50)
	g.period = time.Duration(between(job, 0.5, 3) * float64(time.Second))
	g.periodJitter = 0.05
	g.stallP = between(job, 0.01, 0.03)
	g.jitter = between(job, 0.005, 0.03)
	p.dwell = between(job, 0.03, 0.15)
	p.frag = between(r, 0.02, 0.08)
	p.split = between(r, 0.1, 0.4)
	p.allocGap = between(r, 0, 0.005)
	p.lingerMin, p.lingerMax = 2*time.Second, 20*time.Second

	c := float64(capacity)
	// A third of training jobs set a limit (set_per_process_memory_fraction).
	limited := func() {
		if r.Float64() < 1.0/3 {
			f := between(r, 0.3, 0.9)
			g.limit = uint64(f * float64(TotalBytes))
			c = math.Min(c, float64(g.limit))
		}
	}
	// fit scales weights and activations down until the largest step
	// fits in room with the given fragmentation.
	fit := func(room float64, frag float64, largest float64) {
		peak := float64(g.weights) + g.amp*largest
		if peak*(1+frag) > room {
			s := room / (peak * (1 + frag))
			g.weights = uint64(float64(g.weights) * s)
			g.amp *= s
		}
	}

	switch p.Kind {
	case Steady, EvalNoGrad:
		limited()
		g.weights = uint64(between(job, 0.1, 0.45) * c)
		g.amp = between(job, 0.1, 0.45) * c
		if p.Kind == EvalNoGrad {
			g.evalEvery = durationBetween(job, 5*time.Minute, 20*time.Minute)
			g.evalLen = durationBetween(job, 20*time.Second, 90*time.Second)
			// An evaluation batch's graph is at most a training step's
			// activations; part or all of it stays referenced.
			evalPart, keptPart := between(job, 0.5, 1), between(job, 0.3, 1)
			fit(0.9*c, p.frag, 1+g.jitter+evalPart*keptPart)
			g.evalAmp = g.amp * evalPart
			g.evalKeep = uint64(g.evalAmp * keptPart)
		} else {
			fit(0.95*c, p.frag, 1+g.jitter)
		}
	case Leak, MultiRank:
		if p.Kind == Leak {
			limited()
		}
		g.weights = uint64(between(job, 0.1, 0.3) * c)
		g.amp = between(job, 0.1, 0.3) * c
		if p.Kind == MultiRank {
			// Ranks differ a little (uneven shards).
			g.weights = uint64(float64(g.weights) * between(r, 0.98, 1.02))
		}
		p.frag = between(r, 0.01, 0.03)
		p.split = between(r, 0.05, 0.2)
		if p.Kind == Leak || p.Rank == 0 {
			// The time to OOM sets the leak's rate.
			toOOM := between(job, 5, 30) * float64(time.Minute)
			steps := toOOM / float64(g.period)
			room := c/(1+tightFrag) - float64(g.weights) - g.amp*(1+g.jitter)
			g.leakPerStep = uint64(math.Max(room, 0) / steps)
		}
	case Growth:
		limited()
		g.weights = uint64(between(job, 0.15, 0.35) * c)
		g.amp = between(job, 0.15, 0.35) * c
		p.frag = between(r, 0.03, 0.08)
		p.split = between(r, 0.05, 0.3)
		// A curriculum: the sequence grows every 20-90 s, so that the
		// step's peak reaches the capacity 8-30 minutes after the start.
		toOOM := between(job, 8, 30) * float64(time.Minute)
		g.growEvery = durationBetween(job, 20*time.Second, 90*time.Second)
		room := c/(1+tightFrag) - float64(g.weights) - g.amp*(1+g.jitter)
		g.growStep = math.Max(room, 0) / (toOOM / float64(g.growEvery))
	case Fragmentation:
		limited()
		g.weights = uint64(between(job, 0.1, 0.3) * c)
		g.amp = between(job, 0.15, 0.35) * c
		g.jitter = between(job, 0.1, 0.2)
		p.frag = between(r, 0.15, 0.35)
		p.split = between(r, 0.5, 0.8)
		g.bigP = 1 / between(job, 150, 600)
		g.bigX = between(job, 0.3, 0.6)
		// Scale so that the largest batch, with the waste of
		// fragmentation, needs 2-10% more than the capacity (a retry),
		// and fits in fresh segments after a flush (no OOM).
		big := float64(g.weights) + g.amp*(1+g.bigX)
		s := c * between(r, 1.02, 1.1) / (big * (1 + p.frag))
		g.weights = uint64(float64(g.weights) * s)
		g.amp *= s
		fit(0.97*c, tightFrag, 1+g.bigX)
		fit(c, p.frag, 1+g.jitter)
	case Spike:
		g.weights = uint64(between(job, 0.2, 0.5) * c)
		g.amp = between(job, 0.02, 0.08) * c
		g.jitter = 0.3
		g.period = time.Duration(between(job, 0.5, 5) * float64(time.Second))
		g.spikeMin, g.spikeMax = 15*time.Minute, 60*time.Minute
		p.catches = true
	case CacheHeavy:
		g.weights = uint64(between(job, 0.1, 0.3) * c)
		g.warmCache = uint64(between(job, 0.2, 0.5) * c)
		g.amp = between(job, 0.005, 0.02) * c
		g.period = time.Duration(between(job, 5, 30) * float64(time.Second))
		p.frag = 0.02
	case NVMLOnly:
		g.weights = uint64(between(job, 0.03, 0.08) * c)
		g.amp = 0
		g.period = 10 * time.Second
	}
	return g
}

// step returns the next step of p, starting at now. capacity says how much
// p's allocator could reserve now (a spike asks for more).
func (g *program) step(p *proc, now time.Duration, capacity func() uint64) step {
	if g.loaded < g.loadSteps {
		// Loading the model: weights arrive in one-second chunks.
		g.loaded++
		w := uint64(float64(g.weights) * float64(g.loaded) / float64(g.loadSteps))
		s := step{floor: w, peak: w, length: time.Second, request: pageUp(g.weights / uint64(g.loadSteps))}
		if g.loaded == g.loadSteps {
			g.trainStart = now + time.Second
			s.peak += g.warmCache
			g.nextEval = g.trainStart + g.evalEvery
			if g.spikeMax > 0 {
				g.nextSpike = g.trainStart + durationBetween(g.rng, g.spikeMin, g.spikeMax)
			}
		}
		return s
	}
	g.steps++
	// Steps take about the same time; now and then one stalls (a log
	// line that syncs, a slow batch, the garbage collector), which also
	// keeps a scrape from seeing the same point of every step.
	stretch := 1 + g.periodJitter*(2*g.timing.Float64()-1)
	if g.timing.Float64() < g.stallP {
		stretch += between(g.timing, 0.5, 2)
	}
	length := time.Duration(float64(g.period) * stretch)
	x := g.jitter * (2*g.rng.Float64() - 1)
	if g.bigP > 0 && g.rng.Float64() < g.bigP {
		x = g.bigX * between(g.rng, 0.8, 1)
	}
	if g.growEvery > 0 {
		g.grown = g.growStep * math.Floor(float64(now-g.trainStart)/float64(g.growEvery))
	}
	amp := (g.amp + g.grown) * (1 + x)
	floor := g.weights + g.leakPerStep*uint64(g.steps) + g.kept

	if g.evalEvery > 0 && now >= g.nextEval {
		if g.evalEnd < g.nextEval {
			g.evalEnd = now + g.evalLen
		}
		if now < g.evalEnd {
			// Evaluation: forward passes only, each keeping its graph
			// while its loss is referenced.
			amp = g.evalAmp * (1 + x)
		} else {
			// The last batch's graph stays referenced after evaluation.
			g.kept = g.evalKeep
			floor = g.weights + g.kept
			g.nextEval = now + g.evalEvery
		}
	}
	s := step{floor: blockDown(floor), length: length}
	s.peak = blockDown(floor + uint64(amp))
	// The allocation that fails at an OOM is one of the step's tensors.
	s.request = pageUp(uint64(amp * between(g.rng, 0.03, 0.15)))
	if g.spikeMax > 0 && now >= g.nextSpike {
		g.nextSpike = now + durationBetween(g.rng, g.spikeMin, g.spikeMax)
		extra := pageUp(uint64(between(g.rng, 1, 16) * GiB))
		s.request = pageUp(capacity()-min(capacity(), s.floor)) + extra
		s.peak = s.floor + s.request
	}
	return s
}
