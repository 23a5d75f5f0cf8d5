package collector

import (
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/internal/mocknode"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/workload"
)

// trainer is the workload of pid 1000 in the golden cases: a Kubernetes
// pod that also runs under Slurm.
var trainer = workload.Info{
	Comm: "python3", UID: "1000", ContainerID: "cri-0123abcd", PodUID: "5e1c7a43-0d7c-4f0e-9a51-6f1d2c3b4a59",
	SlurmJobID: "4242", Namespace: "ml", Pod: "train-0", Container: "trainer",
}

// twoGPUNode is the base of most cases: GPU 0 runs pid 1000 (12 GiB, after
// a 14 GiB first poll) and pid 1001 (8 GiB) with 2 GiB unattributed, GPU 1
// runs pid 1100 (6 GiB).
func twoGPUNode() *mockNode {
	node := mocknode.New(2)
	node.SetUsed(0, 2*GiB, proc(1000, 12*GiB), proc(1001, 8*GiB))
	node.SetUsed(1, 0, proc(1100, 6*GiB))
	return node
}

// pollTwoGPUNode polls the node twice, pid 1000 at 14 GiB and then 12 GiB,
// so that its peak differs from its used.
func pollTwoGPUNode(t *testing.T, node *mockNode) *nvmlpoll.Poller {
	t.Helper()
	node.SetUsed(0, 2*GiB, proc(1000, 14*GiB), proc(1001, 8*GiB))
	p := newPoller(t, node)
	node.SetUsed(0, 2*GiB, proc(1000, 12*GiB), proc(1001, 8*GiB))
	if err := p.Poll(); err != nil {
		t.Fatalf("second poll: %v", err)
	}
	return p
}

// trainerStore holds pid 1000's allocator on GPU 0 with every optional
// field: 10 GiB reserved, 7 GiB active, and an OOM a minute before t0.
func trainerStore() *allocstats.Store {
	store := allocstats.NewStore(0)
	mustReportOOM(store, 1000, gpuUUID(0), 916*MiB, t0.Add(-60e9))
	mustReport(store, 1000, "pytorch", []allocstats.DeviceReport{fullReport(gpuUUID(0), 10*GiB, 7*GiB)}, t0)
	return store
}

func gib(n float64) float64 { return n * GiB }

func TestGoldenScrapes(t *testing.T) {
	cases := []struct {
		name string // also the golden file's
		// setup builds the sources and names the collectors (all when nil).
		setup func(t *testing.T) (Sources, []string)
		// check states the case's point against the gathered series, so
		// that a regenerated golden file cannot hide it.
		check func(t *testing.T, s []sample)
	}{
		{
			name: "two_gpus",
			setup: func(t *testing.T) (Sources, []string) {
				return sources(pollTwoGPUNode(t, twoGPUNode()), trainerStore(), fakeResolver{1000: trainer}), nil
			},
			check: func(t *testing.T, s []sample) {
				g0 := []string{"gpu", "0", "uuid", gpuUUID(0)}
				for name, want := range map[string]float64{
					"gpumem_gpu_memory_total_bytes":        gib(100),
					"gpumem_gpu_memory_used_bytes":         gib(22),
					"gpumem_gpu_memory_free_bytes":         gib(77),
					"gpumem_gpu_memory_reserved_bytes":     gib(1),
					"gpumem_gpu_memory_unattributed_bytes": gib(2),
					"gpumem_gpu_processes":                 2,
				} {
					if got := one(t, s, name, g0...); got != want {
						t.Errorf("%s on GPU 0 = %v, want %v", name, got, want)
					}
				}
				p := []string{"pid", "1000", "uuid", gpuUUID(0)}
				for name, want := range map[string]float64{
					"gpumem_process_memory_used_bytes": gib(12),
					"gpumem_process_memory_peak_bytes": gib(14),
					"gpumem_process_context_bytes":     gib(2), // 12 used - 10 reserved
					"gpumem_allocator_reserved_bytes":  gib(10),
					"gpumem_allocator_active_bytes":    gib(7),
					"gpumem_allocator_inactive_bytes":  gib(3), // reserved - active
				} {
					if got := one(t, s, name, p...); got != want {
						t.Errorf("%s of pid 1000 = %v, want %v", name, got, want)
					}
				}
				if n := len(find(s, "gpumem_process_context_bytes", "pid", "1001")); n != 0 {
					t.Errorf("pid 1001 reports no allocator stats but has %d context series", n)
				}
				if n := len(find(s, "gpumem_process_info", "pid", "1000", "framework", "pytorch")); n != 1 {
					t.Errorf("process_info of pid 1000 with framework=pytorch: %d series, want 1", n)
				}
				for _, name := range []string{"gpumem_allocator_alloc_retries_total", "gpumem_allocator_ooms_total"} {
					for _, c := range find(s, name) {
						if c.typ != dto.MetricType_COUNTER {
							t.Errorf("%s is a %v, want a counter", name, c.typ)
						}
					}
				}
			},
		},
		{
			name: "allocator_only",
			setup: func(t *testing.T) (Sources, []string) {
				store := allocstats.NewStore(0)
				mustReport(store, 2000, "jax", []allocstats.DeviceReport{fullReport(gpuUUID(1), 4*GiB, 3*GiB)}, t0)
				return sources(newPoller(t, twoGPUNode()), store, fakeResolver{2000: {Comm: "python3"}}), nil
			},
			check: func(t *testing.T, s []sample) {
				p := []string{"pid", "2000", "uuid", gpuUUID(1), "gpu", "1"}
				if got := one(t, s, "gpumem_allocator_reserved_bytes", p...); got != gib(4) {
					t.Errorf("allocator reserved of the allocator-only pid = %v, want 4 GiB", got)
				}
				one(t, s, "gpumem_process_info", append(p, "framework", "jax")...)
				for _, name := range []string{"gpumem_process_memory_used_bytes", "gpumem_process_memory_peak_bytes", "gpumem_process_context_bytes"} {
					if n := len(find(s, name, "pid", "2000")); n != 0 {
						t.Errorf("NVML does not list pid 2000, yet it has %d %s series", n, name)
					}
				}
				if got := one(t, s, "gpumem_gpu_processes", "gpu", "1"); got != 1 {
					t.Errorf("GPU 1 processes = %v, want 1: an allocator-only pid is not an NVML process", got)
				}
			},
		},
		{
			name: "mig",
			setup: func(t *testing.T) (Sources, []string) {
				node := twoGPUNode()
				enableMIG(node, 0)
				store := allocstats.NewStore(0)
				mustReport(store, 7000, "pytorch", []allocstats.DeviceReport{{UUID: migUUID(0, 0), Reserved: 2 * GiB, Active: allocstats.Some(1 * GiB)}}, t0)
				return sources(newPoller(t, node), store, nil), nil
			},
			check: func(t *testing.T, s []sample) {
				parent := find(s, "gpumem_gpu_info", "uuid", gpuUUID(0))
				if len(parent) != 1 || parent[0].labels["mig_mode"] != "enabled" || parent[0].labels["parent_uuid"] != "" {
					t.Errorf("parent gpu_info = %+v, want one series with mig_mode=enabled and no parent_uuid", parent)
				}
				for _, x := range s {
					if x.labels["uuid"] == gpuUUID(0) && x.name != "gpumem_gpu_info" {
						t.Errorf("the MIG-mode parent exports %s%v: its memory belongs to its instances", x.name, x.labels)
					}
				}
				for j := 0; j < 2; j++ {
					one(t, s, "gpumem_gpu_info", "uuid", migUUID(0, j), "gpu", "0", "parent_uuid", gpuUUID(0), "mig_mode", "")
					if got := one(t, s, "gpumem_gpu_memory_total_bytes", "uuid", migUUID(0, j), "gpu", "0"); got != gib(20) {
						t.Errorf("MIG instance %d total = %v, want 20 GiB", j, got)
					}
				}
				p := []string{"pid", "7000", "uuid", migUUID(0, 0), "gpu", "0"}
				if got := one(t, s, "gpumem_process_memory_used_bytes", p...); got != gib(3) {
					t.Errorf("pid 7000 used on its MIG instance = %v, want 3 GiB", got)
				}
				if got := one(t, s, "gpumem_process_context_bytes", p...); got != gib(1) {
					t.Errorf("pid 7000 context = %v, want 1 GiB (3 used - 2 reserved)", got)
				}
				if got := one(t, s, "gpumem_nvml_errors_total", "call", "GetGraphicsRunningProcesses"); got != 0 {
					t.Errorf("graphics lists unsupported on MIG instances counted %v errors, want 0", got)
				}
			},
		},
		{
			name: "v1_fallback",
			setup: func(t *testing.T) (Sources, []string) {
				node := twoGPUNode()
				node.Device(1).GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
					return gonvml.Memory_v2{}, gonvml.ERROR_FUNCTION_NOT_FOUND
				}
				return sources(newPoller(t, node), nil, nil), nil
			},
			check: func(t *testing.T, s []sample) {
				if n := len(find(s, "gpumem_gpu_memory_reserved_bytes", "gpu", "1")); n != 0 {
					t.Errorf("GPU 1 on NVML's v1 memory info exports %d reserved series, want none", n)
				}
				if got := one(t, s, "gpumem_gpu_memory_used_bytes", "gpu", "1"); got != gib(7) {
					t.Errorf("GPU 1 used = %v, want v1's 7 GiB (6 GiB of processes + 1 GiB driver reservation)", got)
				}
				one(t, s, "gpumem_gpu_memory_reserved_bytes", "gpu", "0")
			},
		},
		{
			name: "process_lists_not_supported",
			setup: func(t *testing.T) (Sources, []string) {
				node := twoGPUNode()
				notSupported := func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
				node.Device(1).GetComputeRunningProcessesFunc = notSupported
				node.Device(1).GetGraphicsRunningProcessesFunc = notSupported
				return sources(newPoller(t, node), nil, nil), nil
			},
			check: func(t *testing.T, s []sample) {
				for _, name := range []string{"gpumem_gpu_processes", "gpumem_gpu_memory_unattributed_bytes", "gpumem_process_memory_used_bytes", "gpumem_process_info"} {
					if n := len(find(s, name, "gpu", "1")); n != 0 {
						t.Errorf("GPU 1 has no process lists, yet %s has %d series for it", name, n)
					}
				}
				one(t, s, "gpumem_gpu_memory_used_bytes", "gpu", "1")
				if got := one(t, s, "gpumem_nvml_errors_total", "call", "GetComputeRunningProcesses"); got != 1 {
					t.Errorf("errors{call=GetComputeRunningProcesses} = %v, want 1", got)
				}
			},
		},
		{
			name: "gpu_lost",
			setup: func(t *testing.T) (Sources, []string) {
				node := twoGPUNode()
				node.Device(1).GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
					return gonvml.Memory_v2{}, gonvml.ERROR_GPU_IS_LOST
				}
				return sources(newPoller(t, node), nil, nil), nil
			},
			check: func(t *testing.T, s []sample) {
				for _, name := range []string{"gpumem_gpu_memory_total_bytes", "gpumem_gpu_memory_used_bytes", "gpumem_gpu_memory_free_bytes", "gpumem_gpu_memory_reserved_bytes", "gpumem_gpu_memory_unattributed_bytes"} {
					if n := len(find(s, name, "gpu", "1")); n != 0 {
						t.Errorf("GPU 1 is lost, yet %s has %d series for it", name, n)
					}
					if n := len(find(s, name, "gpu", "0")); n != 1 {
						t.Errorf("GPU 0 is fine, yet %s has %d series for it, want 1", name, n)
					}
				}
				if got := one(t, s, "gpumem_nvml_errors_total", "call", "GetMemoryInfo_v2"); got != 1 {
					t.Errorf("errors{call=GetMemoryInfo_v2} = %v, want 1", got)
				}
				if got := one(t, s, "gpumem_nvml_up"); got != 1 {
					t.Errorf("nvml_up = %v, want 1: one lost GPU does not take NVML down", got)
				}
			},
		},
		{
			name: "workload_labels",
			setup: func(t *testing.T) (Sources, []string) {
				return sources(pollTwoGPUNode(t, twoGPUNode()), trainerStore(), fakeResolver{1000: trainer}), []string{"process", "allocator"}
			},
			check: func(t *testing.T, s []sample) {
				n := 0
				for _, x := range s {
					switch x.labels["pid"] {
					case "1000":
						n++
						for k, want := range map[string]string{"comm": "python3", "namespace": "ml", "pod": "train-0", "container": "trainer"} {
							if x.labels[k] != want {
								t.Errorf("%s of pid 1000: %s=%q, want %q", x.name, k, x.labels[k], want)
							}
						}
					case "1001":
						if x.labels["comm"] != "proc1001" || x.labels["namespace"] != "" || x.labels["pod"] != "" {
							t.Errorf("%s of pid 1001 (unknown to the resolver): labels %v, want comm from NVML and no pod", x.name, x.labels)
						}
					}
				}
				if n < 10 {
					t.Errorf("pid 1000 has %d series, want its process and allocator series", n)
				}
				info := find(s, "gpumem_process_info", "pid", "1000")
				if len(info) != 1 {
					t.Fatalf("process_info of pid 1000: %d series, want 1", len(info))
				}
				for k, want := range map[string]string{"container_id": trainer.ContainerID, "pod_uid": trainer.PodUID, "slurm_job_id": "4242", "uid": "1000", "framework": "pytorch"} {
					if got := info[0].labels[k]; got != want {
						t.Errorf("process_info of pid 1000: %s=%q, want %q", k, got, want)
					}
				}
			},
		},
		{
			name: "only_gpu_collector",
			setup: func(t *testing.T) (Sources, []string) {
				return sources(pollTwoGPUNode(t, twoGPUNode()), trainerStore(), fakeResolver{1000: trainer}), []string{"gpu"}
			},
			check: func(t *testing.T, s []sample) {
				for _, x := range s {
					if c, ok := x.labels["collector"]; ok && c != "gpu" {
						t.Errorf("%s{collector=%q} from a disabled collector", x.name, c)
					}
					switch x.name {
					case "gpumem_scrape_collector_success", "gpumem_scrape_collector_duration_seconds":
					default:
						if len(x.name) < len("gpumem_gpu_") || x.name[:len("gpumem_gpu_")] != "gpumem_gpu_" {
							t.Errorf("%s gathered with only the gpu collector enabled", x.name)
						}
					}
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, names := tc.setup(t)
			reg := newRegistry(t, src, names...)
			compareGolden(t, reg, tc.name)
			tc.check(t, gather(t, reg))
		})
	}
}

// enableMIG puts mock GPU i in MIG mode with two 20 GiB instances; the
// first runs pid 7000 with 3 GiB, and neither has graphics lists.
func enableMIG(node *mockNode, i int) {
	d := node.Device(i)
	d.GetMigModeFunc = func() (int, int, gonvml.Return) {
		return gonvml.DEVICE_MIG_ENABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 7, gonvml.SUCCESS }
	var migs []gonvml.Device
	for j := 0; j < 2; j++ {
		var procs []gonvml.ProcessInfo
		if j == 0 {
			procs = []gonvml.ProcessInfo{{Pid: 7000, UsedGpuMemory: 3 * GiB, GpuInstanceId: 1}}
		}
		migs = append(migs, &mock.Device{
			GetUUIDFunc: func() (string, gonvml.Return) { return migUUID(i, j), gonvml.SUCCESS },
			GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA H200 MIG 3g.71gb", gonvml.SUCCESS },
			GetMemoryInfo_v2Func: func() (gonvml.Memory_v2, gonvml.Return) {
				return memV2(20*GiB, 0, uint64(len(procs))*3*GiB), gonvml.SUCCESS
			},
			GetComputeRunningProcessesFunc:  func() ([]gonvml.ProcessInfo, gonvml.Return) { return procs, gonvml.SUCCESS },
			GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED },
		})
	}
	d.GetMigDeviceHandleByIndexFunc = func(j int) (gonvml.Device, gonvml.Return) {
		if j < len(migs) {
			return migs[j], gonvml.SUCCESS
		}
		return nil, gonvml.ERROR_NOT_FOUND
	}
}
