package landing

import (
	"fmt"
	"time"

	"github.com/gpumem/gpumem_exporter/allocstats"
	"github.com/gpumem/gpumem_exporter/attribution"
	"github.com/gpumem/gpumem_exporter/diagnosis"
	"github.com/gpumem/gpumem_exporter/nvmlpoll"
	"github.com/gpumem/gpumem_exporter/oom"
	"github.com/gpumem/gpumem_exporter/workload"
)

// fixedLookup names processes as the workload cache would.
type fixedLookup map[uint32]workload.Info

func (l fixedLookup) Lookup(pid uint32) (workload.Info, bool) {
	in, ok := l[pid]
	return in, ok
}

func ptr[T any](v T) *T { return &v }

// h200Total is an H200's memory as NVML reports it.
const h200Total = 150754820096

// Names as long as Kubernetes allows them to get, and a process name with
// no place to break: the page must wrap them, not the numbers.
const (
	longNamespace = "research-foundation-models-eval"
	longContainer = "pytorch-trainer-main"
	longComm      = "averyveryverylongprocessnamewithoutanybreaks_0123456789"
)

func longPod(gpu, i int) string {
	return fmt.Sprintf("llm-pretrain-llama-3-70b-instruct-finetune-worker-%d-%d-5d9c8b7f6d-x2k9p", gpu, i)
}

// richConfig is a busy node: eight H200s with nine processes each (six of
// them report allocator stats, one has a name without a break, all run in
// pods with long names; two climb towards an OOM, one under the warning
// threshold), and four OOM reports: 5 and 40 minutes old (the
// first by a process outside the top five holders), 3 hours and 3 days old.
func richConfig(now time.Time) Config {
	const perGPU = 9
	snap := &nvmlpoll.Snapshot{Time: now}
	var procs []allocstats.Process
	names := fixedLookup{}
	forecasts := fakeForecasts{}
	for g := 0; g < 8; g++ {
		d := nvmlpoll.Device{Index: g, UUID: uuid(g), Name: "NVIDIA H200", MIGMode: nvmlpoll.MIGDisabled,
			HasMemory: true, HasProcesses: true}
		var used uint64
		for i := 0; i < perGPU; i++ {
			pid := uint32(100000 + 100*g + i)
			u := uint64(1+i) * 1536 * MiB
			used += u
			d.Processes = append(d.Processes, nvmlpoll.Process{PID: pid, HasUsed: true, UsedBytes: u})
			comm := "python3"
			if i == 4 {
				comm = longComm
			}
			names[pid] = workload.Info{PID: pid, Comm: comm, Namespace: longNamespace, Pod: longPod(g, i), Container: longContainer}
			switch i {
			case 0:
				forecasts[pid] = diagnosis.Forecast{Climb: diagnosis.Climb{Cause: diagnosis.Leak}, ETA: 6 * time.Minute}
			case 1:
				forecasts[pid] = diagnosis.Forecast{Climb: diagnosis.Climb{Cause: diagnosis.Growth}, ETA: 150 * time.Minute}
			}
			if i%3 != 2 {
				reserved := u - 512*MiB
				procs = append(procs, allocstats.Process{PID: pid, Framework: "pytorch", Devices: []allocstats.DeviceStats{
					{UUID: uuid(g), HasStats: true, Reserved: reserved, Active: allocstats.Some(reserved * 3 / 4)}}})
			}
		}
		used += 700 * MiB // unattributed
		reserved := uint64(572 * MiB)
		d.Memory = nvmlpoll.Memory{Total: h200Total, Reserved: reserved, Used: used, Free: h200Total - reserved - used, HasReserved: true}
		snap.Devices = append(snap.Devices, d)
	}
	return Config{
		Name: "gpumem_exporter", Version: "0.1.0-dev", Revision: "2c63bba1f0e4d5c6b7a8990011223344556677aa",
		MetricsPath: "/metrics", Backend: "simulated", Socket: "/run/user/1000/gpumem/allocstats.sock",
		Sources:   attribution.Sources{NVML: fixedSnapshot{snap}, Allocator: fixedProcs(procs), Workload: names, Forecasts: forecasts},
		Forecasts: forecasts,
		NVMLUp:    func() bool { return true },
		Reports: fakeReports{
			richReport(now.Add(-5*time.Minute), 3, 8, 916*MiB),
			richReport(now.Add(-40*time.Minute), 5, 0, 20*GiB),
			richReport(now.Add(-3*time.Hour), 0, 2, 2*GiB+512*MiB),
			richReport(now.Add(-72*time.Hour), 7, 1, 128*MiB),
		},
		Now: func() time.Time { return now },
	}
}

// richReport is an OOM on GPU gpu reported by the process at position
// reporter (0: the largest) among nine holders.
func richReport(at time.Time, gpu, reporter int, requested uint64) oom.Report {
	const holders = 9
	rep := oom.Report{
		Time: at, GPU: fmt.Sprint(gpu), UUID: uuid(gpu), RequestedBytes: requested,
		LimitBytes: ptr(uint64(h200Total)), FreeBytes: ptr(uint64(300 * MiB)),
		NVMLTime: ptr(at.Add(400 * time.Millisecond)), NVMLDelaySeconds: ptr(0.4),
		DeviceMemory: &oom.DeviceMemory{TotalBytes: h200Total, UsedBytes: h200Total - 872*MiB, FreeBytes: 300 * MiB, ReservedBytes: ptr(uint64(572 * MiB))},
		Totals:       oom.Totals{UnattributedBytes: ptr(uint64(700 * MiB))},
		Verdict: diagnosis.Verdict{Cause: diagnosis.Neighbours, Contributing: []diagnosis.Cause{diagnosis.Contexts},
			Summary: "The GPU had 300.00 MiB free, 616.00 MiB short of the request of 916.00 MiB; 8 other processes held 120.00 GiB: pid 200000 (python3) in pod " + longNamespace + "/" + longPod(gpu, 0) + " container " + longContainer + " 27.00 GiB (context 1.00 GiB, active 13.50 GiB, inactive 12.50 GiB).",
			Remedy:  "Other processes hold the GPU: torch.cuda.empty_cache() in pid 200000 (python3) would give back up to 12.50 GiB of inactive cache; or run this job where the GPU has room."},
	}
	for i := 0; i < holders; i++ {
		used := uint64(holders-i) * 3 * GiB
		p := oom.Process{PID: uint32(200000 + 100*gpu + i), Comm: "python3", Namespace: longNamespace,
			Pod: longPod(gpu, i), Container: longContainer, NVMLListed: true, UsedBytes: ptr(used),
			Reporting: i == reporter}
		if i%2 == 0 {
			p.ReservedBytes, p.ActiveBytes = ptr(used-GiB), ptr(used/2)
			p.InactiveBytes, p.ContextBytes = ptr(used-GiB-used/2), ptr(uint64(GiB))
			p.ContextStale = i == 4
			rep.Totals.ReservedBytes += *p.ReservedBytes
			rep.Totals.ActiveBytes += *p.ActiveBytes
			rep.Totals.InactiveBytes += *p.InactiveBytes
			rep.Totals.ContextBytes += *p.ContextBytes
		}
		if i == 6 {
			p.Comm = longComm
		}
		if p.Reporting {
			rep.PID, rep.Comm, rep.Namespace, rep.Pod, rep.Container = p.PID, p.Comm, p.Namespace, p.Pod, p.Container
		}
		rep.Processes = append(rep.Processes, p)
	}
	return rep
}
