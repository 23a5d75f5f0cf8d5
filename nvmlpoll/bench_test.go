package nvmlpoll

import (
	"os"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpumem/gpumem_exporter/simulate"
)

// Benchmarks of one poll cycle. On the simulated node they measure the
// poller's own overhead; with GPUMEM_REAL_NVML=1 on a GPU machine they
// measure a real poll against the raw NVML calls it makes (docs/benchmarks.md).

func BenchmarkPollSimulated(b *testing.B) {
	sim, err := simulate.New(simulate.Config{ProcessesPerGPU: 16, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	p := NewPoller(Config{Lib: sim.Interface()})
	for i := 0; i < 60; i++ { // every slot started
		sim.Step()
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Poll(); err != nil {
			b.Fatal(err)
		}
	}
}

func realNVML(b *testing.B) nvml.Interface {
	if os.Getenv("GPUMEM_REAL_NVML") != "1" {
		b.Skip("set GPUMEM_REAL_NVML=1 on a machine with an NVIDIA driver")
	}
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		b.Fatalf("nvmlInit: %v", ret)
	}
	b.Cleanup(func() { lib.Shutdown() })
	return lib
}

// BenchmarkRealPoll is one whole poll cycle of the poller on the real GPUs.
func BenchmarkRealPoll(b *testing.B) {
	p := NewPoller(Config{Lib: realNVML(b)})
	if err := p.Poll(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if err := p.Poll(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRealRawCalls makes the NVML calls a poll makes, and nothing else.
func BenchmarkRealRawCalls(b *testing.B) {
	lib := realNVML(b)
	for b.Loop() {
		n, _ := lib.DeviceGetCount()
		for i := 0; i < n; i++ {
			d, _ := lib.DeviceGetHandleByIndex(i)
			d.GetUUID()
			d.GetName()
			d.GetPciInfo()
			d.GetMigMode()
			d.GetMemoryInfo_v2()
			d.GetComputeRunningProcesses()
			d.GetGraphicsRunningProcesses()
		}
	}
}

func benchCall(b *testing.B, call func(nvml.Device)) {
	lib := realNVML(b)
	d, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		b.Fatal(ret)
	}
	for b.Loop() {
		call(d)
	}
}

func BenchmarkRealGetMemoryInfoV2(b *testing.B) {
	benchCall(b, func(d nvml.Device) { d.GetMemoryInfo_v2() })
}

func BenchmarkRealGetComputeRunningProcesses(b *testing.B) {
	benchCall(b, func(d nvml.Device) { d.GetComputeRunningProcesses() })
}

func BenchmarkRealGetGraphicsRunningProcesses(b *testing.B) {
	benchCall(b, func(d nvml.Device) { d.GetGraphicsRunningProcesses() })
}
