package nvmlpoll

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// testUUID pins the UUIDs of the mock's GPUs (dgxh200 picks random ones).
func testUUID(i int) string { return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i) }

// newMockNode returns eight H200s, each with 10 GiB used by pid 1000+i
// holding 4 GiB, the v2 memory call and empty graphics lists.
func newMockNode() *server.Server {
	s := dgxh200.New()
	s.SystemGetProcessNameFunc = func(pid int) (string, nvml.Return) { return fmt.Sprintf("proc%d", pid), nvml.SUCCESS }
	for i, dev := range s.Devices {
		d := dev.(*server.Device)
		d.UUID = testUUID(i)
		i := i
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			id := fmt.Sprintf("00000000:%02X:00.0", i+1)
			for k := range id {
				p.BusId[k] = int8(id[k])
			}
			return p, nvml.SUCCESS
		}
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			return nvml.Memory_v2{Total: 100 * GiB, Reserved: 1 * GiB, Used: 10 * GiB, Free: 89 * GiB}, nvml.SUCCESS
		}
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 100 * GiB, Used: 11 * GiB, Free: 89 * GiB}, nvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: uint32(1000 + i), UsedGpuMemory: 4 * GiB}}, nvml.SUCCESS
		}
		d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	}
	return s
}

func mockDevice(s *server.Server, i int) *server.Device { return s.Devices[i].(*server.Device) }

// enableMIG puts GPU i in MIG mode with two instances of 20 GiB, the first
// holding one process of 3 GiB.
func enableMIG(s *server.Server, i int) {
	d := mockDevice(s, i)
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	var migs []*mock.Device
	for j := 0; j < 2; j++ {
		j := j
		m := &mock.Device{
			GetUUIDFunc: func() (string, nvml.Return) {
				return fmt.Sprintf("MIG-00000000-0000-4000-9000-%06d%06d", i, j), nvml.SUCCESS
			},
			GetNameFunc: func() (string, nvml.Return) { return "NVIDIA H200 MIG 3g.71gb", nvml.SUCCESS },
			GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) {
				used := uint64(0)
				if j == 0 {
					used = 3 * GiB
				}
				return nvml.Memory_v2{Total: 20 * GiB, Used: used, Free: 20*GiB - used}, nvml.SUCCESS
			},
			GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
				if j == 0 {
					return []nvml.ProcessInfo{{Pid: 7000, UsedGpuMemory: 3 * GiB, GpuInstanceId: 1, ComputeInstanceId: 0}}, nvml.SUCCESS
				}
				return nil, nvml.SUCCESS
			},
			GetGraphicsRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
		}
		migs = append(migs, m)
	}
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j < len(migs) {
			return migs[j], nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

const (
	MiB = 1 << 20
	GiB = 1 << 30
)

// onEachPoll makes s call f as each poll begins: at its count of devices.
func onEachPoll(s *server.Server, f func()) *server.Server {
	count := s.DeviceGetCountFunc
	s.DeviceGetCountFunc = func() (int, nvml.Return) {
		f()
		return count()
	}
	return s
}
