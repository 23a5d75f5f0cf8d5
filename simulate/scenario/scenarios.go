package scenario

import (
	"fmt"
	"sort"
	"time"
)

// Mix is the default scenario: one of each workload on the node, so that
// every metric and every alert moves:
//
//	GPU 0  steady training            pod ml/bert-finetune-0
//	GPU 1  list-append leak           pod ml/leaky-train-0
//	GPU 2  growth to OOM              Slurm job 4242
//	GPU 3  fragmentation              pod ml/seq2seq-0
//	GPU 4  eval without no_grad       a plain process (no pod, no Slurm job)
//	       + a process that reports no allocator statistics (pod serve/triton-0)
//	GPU 5  idle notebook, large cache pod ml/notebook-0
//	       + inference server, spikes pod serve/llm-api-0
//	GPU 6-7 two-rank job, rank 0 leaks pod ml/ddp-train-0
//
// GPU 7 also has 3 GiB used by no listed process (unattributed).
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
}

// layout returns a scenario's jobs, in the order they start, and each GPU's
// unattributed memory.
type layout func() ([]jobSpec, [GPUs]uint64)

var layouts = map[string]layout{Mix: mixLayout}

func init() {
	for _, kind := range []string{Steady, Leak, EvalNoGrad, Growth, Fragmentation, Spike, CacheHeavy, MultiRank} {
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
	var specs []jobSpec
	for g := 0; g < GPUs; g++ {
		switch g % 4 {
		case 1:
			specs = append(specs, plain(kind, g, fmt.Sprintf("%s-%d", kind, g), 1))
		case 3:
			specs = append(specs, slurm(kind, g, fmt.Sprint(4200+g)))
		default:
			specs = append(specs, pod(kind, []int{g}, "ml", fmt.Sprintf("%s-%d", kind, g), "main", 1))
		}
	}
	return specs
}

func mixLayout() ([]jobSpec, [GPUs]uint64) {
	specs := []jobSpec{
		pod(Steady, []int{0}, "ml", "bert-finetune-0", "trainer", 1),
		pod(Leak, []int{1}, "ml", "leaky-train-0", "trainer", 1),
		slurm(Growth, 2, "4242"),
		pod(Fragmentation, []int{3}, "ml", "seq2seq-0", "trainer", 1),
		pod(NVMLOnly, []int{4}, "serve", "triton-0", "server", 0.1),
		plain(EvalNoGrad, 4, "eval-no-grad", 1),
		pod(CacheHeavy, []int{5}, "ml", "notebook-0", "jupyter", 0.45),
		pod(Spike, []int{5}, "serve", "llm-api-0", "server", 1),
		pod(MultiRank, []int{6, 7}, "ml", "ddp-train-0", "trainer", 1),
	}
	var unattributed [GPUs]uint64
	unattributed[7] = 3 * GiB
	return specs, unattributed
}
