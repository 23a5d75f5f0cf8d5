package scenario

import (
	"fmt"
	"sort"
	"time"
)

// Mix is the default scenario: one of each workload on the node, so that
// every metric, every alert and every kind of OOM shows:
//
//	GPU 0  steady training            pod ml/bert-finetune-0 (30% of the GPU)
//	       + eval without no_grad     a plain process (no pod, no Slurm job)
//	       + a process that reports no allocator statistics (pod serve/triton-0)
//	       + a growing batch under a small limit, OOM in minutes (a plain process)
//	       + a first request larger than the GPU, a crash loop (a plain process)
//	       + fragmentation under a limit, caught OOMs (pod ml/ocr-train-0)
//	GPU 1  list-append leak           pod ml/leaky-train-0
//	GPU 2  growth to OOM              Slurm job 4242
//	GPU 3  fragmentation              pod ml/seq2seq-0
//	GPU 4  16 inference workers       pods serve/embed-0 to serve/embed-15
//	       + one more that does not fit beside their contexts (a plain process)
//	GPU 5  idle notebook, large cache pod ml/notebook-0
//	       + inference server, spikes pod serve/llm-api-0
//	       + a server that asks for 90% of the GPU at load (a plain process)
//	GPU 6-7 two-rank job, rank 0 leaks pod ml/ddp-train-0
//
// GPU 7 also has 3 GiB used by no listed process (unattributed). The jobs
// that fail at every run are plain processes, so that each run is a
// workload of its own for the alerts.
const Mix = "mix"

// jobSpec places a job on the node.
type jobSpec struct {
	kind     string
	gpus     []int // one process per GPU, rank = position
	identity Identity
	// share is the part of a GPU's usable memory the job plans on.
	share float64
	// restartMin and restartMax bound the back-off before the job starts
	// again after its processes exited.
	restartMin, restartMax time.Duration
	// regardless says the job plans on its share of the whole GPU,
	// whatever the other processes there hold or planned.
	regardless bool
	// startAfter is when the job first starts (0: with the node).
	startAfter time.Duration
}

// layout returns a scenario's jobs, in the order they start, and each GPU's
// unattributed memory.
type layout func() ([]jobSpec, [GPUs]uint64)

var layouts = map[string]layout{Mix: mixLayout, Neighbours: neighboursLayout, Contexts: contextsLayout}

func init() {
	for _, kind := range []string{Steady, Leak, EvalNoGrad, Growth, Fragmentation, Spike, CacheHeavy, MultiRank,
		Limit, TooLarge, FragmentationOOM} {
		kind := kind
		layouts[kind] = func() ([]jobSpec, [GPUs]uint64) { return replicated(kind), [GPUs]uint64{} }
	}
}

// Names returns the scenarios New knows, sorted.
func Names() []string {
	var names []string
	for name := range layouts {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Restart back-offs: a pod's container restarts after Kubernetes's back-off
// and a start; a Slurm job is requeued; someone restarts a plain process.
var (
	podRestart     = [2]time.Duration{15 * time.Second, 45 * time.Second}
	slurmRestart   = [2]time.Duration{30 * time.Second, 120 * time.Second}
	processRestart = [2]time.Duration{1 * time.Minute, 5 * time.Minute}
)

func pod(kind string, gpus []int, namespace, name, container string, share float64) jobSpec {
	return jobSpec{
		kind: kind, gpus: gpus, share: share,
		identity:   Identity{Job: namespace + "/" + name, Comm: "python3", Namespace: namespace, Pod: name, Container: container},
		restartMin: podRestart[0], restartMax: podRestart[1],
	}
}

func slurm(kind string, gpu int, id string) jobSpec {
	return jobSpec{
		kind: kind, gpus: []int{gpu}, share: 1,
		identity:   Identity{Job: "slurm-" + id, Comm: "python3", SlurmJobID: id},
		restartMin: slurmRestart[0], restartMax: slurmRestart[1],
	}
}

func plain(kind string, gpu int, name string, share float64) jobSpec {
	return jobSpec{
		kind: kind, gpus: []int{gpu}, share: share,
		identity:   Identity{Job: name, Comm: "python3"},
		restartMin: processRestart[0], restartMax: processRestart[1],
	}
}

// replicated runs kind on every GPU: a pod on most, a Slurm job on some and
// a plain process on others, so that alerts are measured for each way of
// grouping. A multi-rank job takes four GPUs.
func replicated(kind string) []jobSpec {
	if kind == MultiRank {
		return []jobSpec{
			pod(kind, []int{0, 1, 2, 3}, "ml", "ddp-train-0", "trainer", 1),
			pod(kind, []int{4, 5, 6, 7}, "ml", "ddp-train-1", "trainer", 1),
		}
	}
	share := 1.0
	if kind == TooLarge {
		share = 0.08 // its model is small; its first request is not
	}
	var specs []jobSpec
	for g := 0; g < GPUs; g++ {
		specs = append(specs, onGPU(kind, g, share))
	}
	return specs
}

// onGPU is one job of kind on GPU g, named by kind and g: a pod, a plain
// process or a Slurm job as g goes.
func onGPU(kind string, g int, share float64) jobSpec {
	switch g % 4 {
	case 1:
		return plain(kind, g, fmt.Sprintf("%s-%d", kind, g), share)
	case 3:
		s := slurm(kind, g, fmt.Sprint(4200+g))
		s.share = share
		return s
	default:
		return pod(kind, []int{g}, "ml", fmt.Sprintf("%s-%d", kind, g), "main", share)
	}
}

// lateComer is a job that plans on its share of the whole GPU regardless of
// the others and starts after the node's other jobs have loaded.
func lateComer(s jobSpec) jobSpec {
	s.regardless = true
	s.startAfter = 2 * time.Minute
	return s
}

// neighboursLayout puts on every GPU an idle notebook that keeps a large
// inactive cache, and an inference server that then asks for 90% of the
// GPU.
func neighboursLayout() ([]jobSpec, [GPUs]uint64) {
	var specs []jobSpec
	for g := 0; g < GPUs; g++ {
		specs = append(specs, pod(CacheHeavy, []int{g}, "ml", fmt.Sprintf("notebook-%d", g), "jupyter", 0.5))
	}
	for g := 0; g < GPUs; g++ {
		specs = append(specs, lateComer(onGPU(Neighbours, g, 0.9)))
	}
	return specs, [GPUs]uint64{}
}

// contextsLayout fills every GPU with 12 to 19 inference workers and sends
// one more to each.
func contextsLayout() ([]jobSpec, [GPUs]uint64) {
	var specs []jobSpec
	for g := 0; g < GPUs; g++ {
		n := 12 + g
		share := contextsShare(n)
		specs = append(specs, contextWorkers(g, n, fmt.Sprintf("embed-%d-", g), share)...)
		specs = append(specs, lateComer(onGPU(Contexts, g, share)))
	}
	return specs, [GPUs]uint64{}
}

// Sizing of the Contexts workers: the most a worker's context takes, and
// what the workers leave free of the GPU.
const (
	contextsMaxContext = CUDAContextBytes + 256*MiB
	contextsSlack      = 1 * GiB
)

// contextsShare is the share of the GPU each of n workers plans on: an
// even part of what is left after their contexts and a slack. One more
// worker of that size finds room for its context, not for its weights.
func contextsShare(n int) float64 {
	return float64(usableBytes-uint64(n)*contextsMaxContext-contextsSlack) / float64(n) / float64(usableBytes)
}

// contextWorkers is n inference workers on GPU g, pods serve/<prefix><k>,
// each planning on share of the GPU.
func contextWorkers(g, n int, prefix string, share float64) []jobSpec {
	var specs []jobSpec
	for k := 0; k < n; k++ {
		w := pod(Contexts, []int{g}, "serve", prefix+fmt.Sprint(k), "server", share)
		w.regardless = true
		specs = append(specs, w)
	}
	return specs
}

func mixLayout() ([]jobSpec, [GPUs]uint64) {
	// The jobs of the first mix keep their places in the list (each job's
	// random draws follow from it); the kinds of OOM come after them.
	specs := []jobSpec{
		pod(Steady, []int{0}, "ml", "bert-finetune-0", "trainer", 0.3),
		pod(Leak, []int{1}, "ml", "leaky-train-0", "trainer", 1),
		slurm(Growth, 2, "4242"),
		pod(Fragmentation, []int{3}, "ml", "seq2seq-0", "trainer", 1),
		pod(NVMLOnly, []int{0}, "serve", "triton-0", "server", 0.1),
		plain(EvalNoGrad, 0, "eval-no-grad", 0.3),
		pod(CacheHeavy, []int{5}, "ml", "notebook-0", "jupyter", 0.45),
		pod(Spike, []int{5}, "serve", "llm-api-0", "server", 1),
		pod(MultiRank, []int{6, 7}, "ml", "ddp-train-0", "trainer", 1),
		plain(Limit, 0, "limit-train", 0.1),
		plain(TooLarge, 0, "too-large", 0.04),
		pod(FragmentationOOM, []int{0}, "ml", "ocr-train-0", "trainer", 0.18),
		lateComer(plain(Neighbours, 5, "vllm-serve", 0.9)),
	}
	const workers = 16
	share := contextsShare(workers)
	specs = append(specs, contextWorkers(4, workers, "embed-", share)...)
	specs = append(specs, lateComer(plain(Contexts, 4, "embed-bench", share)))
	var unattributed [GPUs]uint64
	unattributed[7] = 3 * GiB
	return specs, unattributed
}
