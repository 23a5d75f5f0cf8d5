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
	// Limit is training under a small per-process limit
	// (set_per_process_memory_fraction of 4-10%) whose batch grows every
	// few seconds: it reaches its limit and dies of an OOM 2 to 6 minutes
	// after training starts, while the GPU has plenty of room.
	Limit = "limit"
	// TooLarge loads its model, then asks in its first step for more than
	// the GPU's total memory at once: an OOM every run, a crash loop paced
	// by the job's restart back-off.
	TooLarge = "too-large"
	// Neighbours is an inference server that, after its weights, asks for
	// its KV cache in one piece sized to fill its share of the whole GPU
	// (vLLM's gpu_memory_utilization), whatever the other processes there
	// hold: beside a process that keeps a large inactive cache it fails at
	// load, each time it restarts.
	Neighbours = "neighbours"
	// Contexts is one of many small inference workers on one GPU, sized to
	// share it evenly; each also pays its CUDA context and workspaces
	// (about 0.75 GiB), which the sizing forgot. The GPU holds all but the
	// last, which comes later and fails to load its weights by less than
	// the contexts take together. The workers keep almost no inactive
	// cache: their KV cache is allocated once and stays active.
	Contexts = "contexts"
	// FragmentationOOM is Fragmentation under a limit, with now and then a
	// large batch for which no cached block fits: the cache holds more in
	// split segments than the failing tensor but in pieces too small, the
	// batch raises an OOM, and the program catches it and lives on.
	FragmentationOOM = "fragmentation-oom"
)

// step is one step of a program: active memory goes from floor up to peak
// and back within length. request is the size of the allocation that
// fails if the allocator cannot reserve for peak.
type step struct {
	floor, peak uint64
	length      time.Duration
	request     uint64
	// stuck says that no block of the cache's split segments fits the
	// step's large tensors: after a flush they all need fresh segments.
	stuck bool
	// single says the step is one allocation, the request.
	single bool
}

// program is what one process runs: how each of its steps uses memory.
type program struct {
	kind    string
	rng     *rand.Rand
	timing  *rand.Rand // step lengths: the same for every rank of a job
	context uint64
	limit   uint64

	// prepare is how long the process holds only its context before it
	// loads (reading its checkpoint from disk).
	prepare           time.Duration
	loadSteps, loaded int
	weights           uint64 // the floor once loaded
	warmCache         uint64 // a warm-up batch run once after loading
	period            time.Duration
	periodJitter      float64 // relative spread of a step's length
	stallP            float64 // chance that a step stalls (logging, a slow batch)
	amp               float64 // a step's activations, peak - floor
	jitter            float64 // a step's relative spread of activations

	// pool is allocated in one piece right after the weights (a KV cache)
	// and stays active.
	pool   uint64
	pooled bool

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

	// huge is what each training step asks for at once (TooLarge).
	huge uint64

	// requestLo and requestHi bound the request that fails at an OOM, as
	// a part of the step's activations.
	requestLo, requestHi float64

	// FragmentationOOM: a large batch that no split block fits, the first
	// 3-12 minutes after training starts, then every stuckMin-stuckMax.
	stuckMin, stuckMax time.Duration
	nextStuck          time.Duration
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
	g := &program{kind: p.Kind, rng: r, timing: rand.New(rand.NewPCG(shared, 1<<32)), requestLo: 0.03, requestHi: 0.15}

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
	case Fragmentation, FragmentationOOM:
		if p.Kind == FragmentationOOM {
			g.limit = uint64(between(r, 0.1, 0.15) * float64(TotalBytes))
			c = math.Min(c, float64(g.limit))
			g.stuckMin, g.stuckMax = 8*time.Minute, 25*time.Minute
			p.catches = true
		} else {
			limited()
		}
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
	case Limit:
		// A growing batch as in Growth, but fast and under a small limit.
		g.limit = uint64(between(r, 0.04, 0.1) * float64(TotalBytes))
		c = math.Min(c, float64(g.limit))
		g.weights = uint64(between(job, 0.2, 0.4) * c)
		g.amp = between(job, 0.1, 0.2) * c
		p.frag = between(r, 0.02, 0.05)
		p.split = between(r, 0.02, 0.06)
		// The request that fails is one of the batch's large tensors,
		// larger than what the few split segments hold.
		g.requestLo, g.requestHi = 0.15, 0.3
		toOOM := between(job, 2, 6) * float64(time.Minute)
		g.growEvery = durationBetween(job, 3*time.Second, 10*time.Second)
		room := c/(1+tightFrag) - float64(g.weights) - g.amp*(1+g.jitter)
		g.growStep = math.Max(room, 0) / (toOOM / float64(g.growEvery))
	case TooLarge:
		// Loading takes half a minute or more, then the first step asks
		// for 105-160% of the GPU.
		g.loadSteps = 30 + job.IntN(60)
		g.weights = uint64(between(job, 0.3, 0.9) * c)
		g.amp = 0
		g.huge = pageUp(uint64(between(job, 1.05, 1.6) * float64(TotalBytes)))
	case Neighbours:
		// Weights load for 30-60 s, then the KV cache takes the rest of
		// the server's share of the GPU in one allocation.
		g.loadSteps = 30 + job.IntN(30)
		g.weights = uint64(between(job, 0.06, 0.15) * c)
		g.amp = between(job, 0.005, 0.02) * c
		g.jitter = 0.3
		g.period = time.Duration(between(job, 0.5, 5) * float64(time.Second))
		p.frag = 0.01
		g.pool = uint64(math.Max(c/(1+p.frag)-float64(g.weights)-g.amp*(1+g.jitter), 0))
	case Contexts:
		// cuBLAS workspaces of 224-256 MiB beside the CUDA context: about
		// 0.75 GiB a worker. The weights come in one piece after 20-40 s
		// of reading the checkpoint, then the KV cache in one piece; the
		// requests are small and fit in the cache.
		g.context = CUDAContextBytes + pageUp(uint64(between(r, 224, 256)*MiB))
		g.prepare = durationBetween(job, 20*time.Second, 40*time.Second)
		g.loadSteps = 1
		g.period = time.Duration(between(job, 1, 5) * float64(time.Second))
		g.amp = between(job, 0.001, 0.003) * c
		g.jitter = 0.3
		p.frag = 0.001
		p.split = 0.1
		total := math.Max(c/(1+p.frag)-g.amp*(1+g.jitter), 0)
		g.weights = uint64(total * between(job, 0.4, 0.6))
		g.pool = uint64(total) - g.weights
	}
	// Most of a load is reading the checkpoint, with only the context on
	// the GPU; the weights then arrive in a few one-second chunks: a
	// model's load is a few steps up, then flat.
	if g.loadSteps > maxLoadChunks {
		g.prepare += time.Duration(g.loadSteps-maxLoadChunks) * time.Second
		g.loadSteps = maxLoadChunks
	}
	return g
}

// maxLoadChunks is the most one-second chunks a model's weights take to
// reach the GPU.
const maxLoadChunks = 4

// step returns the next step of p, starting at now. capacity says how much
// p's allocator could reserve now (a spike asks for more).
func (g *program) step(p *proc, now time.Duration, capacity func() uint64) step {
	if g.prepare > 0 {
		d := g.prepare
		g.prepare = 0
		return step{length: d}
	}
	if g.loaded < g.loadSteps {
		// Loading the model: weights arrive in one-second chunks.
		g.loaded++
		w := uint64(float64(g.weights) * float64(g.loaded) / float64(g.loadSteps))
		s := step{floor: w, peak: w, length: time.Second, request: pageUp(g.weights / uint64(g.loadSteps)), single: true}
		if g.loaded == g.loadSteps {
			g.trainStart = now + time.Second
			s.peak += g.warmCache
			g.nextEval = g.trainStart + g.evalEvery
			if g.spikeMax > 0 {
				g.nextSpike = g.trainStart + durationBetween(g.rng, g.spikeMin, g.spikeMax)
			}
			if g.stuckMax > 0 {
				g.nextStuck = g.trainStart + durationBetween(g.rng, 3*time.Minute, 12*time.Minute)
			}
		}
		return s
	}
	if g.pool > 0 && !g.pooled {
		// The KV cache, in one allocation.
		g.pooled = true
		g.weights += g.pool
		return step{floor: g.weights, peak: g.weights, length: time.Second, request: pageUp(g.pool), single: true}
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
	stuck := false
	if g.stuckMax > 0 && now >= g.nextStuck {
		g.nextStuck = now + durationBetween(g.rng, g.stuckMin, g.stuckMax)
		x = g.bigX * between(g.rng, 0.8, 1)
		stuck = true
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
	s := step{floor: blockDown(floor), length: length, stuck: stuck}
	s.peak = blockDown(floor + uint64(amp))
	// The allocation that fails at an OOM is one of the step's tensors.
	s.request = pageUp(uint64(amp * between(g.rng, g.requestLo, g.requestHi)))
	if g.spikeMax > 0 && now >= g.nextSpike {
		g.nextSpike = now + durationBetween(g.rng, g.spikeMin, g.spikeMax)
		extra := pageUp(uint64(between(g.rng, 1, 16) * GiB))
		s.request = pageUp(capacity()-min(capacity(), s.floor)) + extra
		s.peak = s.floor + s.request
	}
	if g.huge > 0 {
		s.request = g.huge
		s.peak = s.floor + g.huge
		s.single = true
	}
	return s
}
