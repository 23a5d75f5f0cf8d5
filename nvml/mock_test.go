package nvml

import (
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
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
	s.SystemGetProcessNameFunc = func(pid int) (string, gonvml.Return) { return fmt.Sprintf("proc%d", pid), gonvml.SUCCESS }
	for i, dev := range s.Devices {
		d := dev.(*server.Device)
		d.UUID = testUUID(i)
		i := i
		d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
			var p gonvml.PciInfo
			id := fmt.Sprintf("00000000:%02X:00.0", i+1)
			for k := range id {
				p.BusId[k] = int8(id[k])
			}
			return p, gonvml.SUCCESS
		}
		d.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
			return gonvml.Memory_v2{Total: 100 * GiB, Reserved: 1 * GiB, Used: 10 * GiB, Free: 89 * GiB}, gonvml.SUCCESS
		}
		d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: 100 * GiB, Used: 11 * GiB, Free: 89 * GiB}, gonvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return []gonvml.ProcessInfo{{Pid: uint32(1000 + i), UsedGpuMemory: 4 * GiB}}, gonvml.SUCCESS
		}
		d.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS }
	}
	return s
}

func mockDevice(s *server.Server, i int) *server.Device { return s.Devices[i].(*server.Device) }

// enableMIG puts GPU i in MIG mode with two instances of 20 GiB, the first
// holding one process of 3 GiB.
func enableMIG(s *server.Server, i int) {
	d := mockDevice(s, i)
	d.GetMigModeFunc = func() (int, int, gonvml.Return) {
		return gonvml.DEVICE_MIG_ENABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 7, gonvml.SUCCESS }
	var migs []*mock.Device
	for j := 0; j < 2; j++ {
		j := j
		m := &mock.Device{
			GetUUIDFunc: func() (string, gonvml.Return) {
				return fmt.Sprintf("MIG-00000000-0000-4000-9000-%06d%06d", i, j), gonvml.SUCCESS
			},
			GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA H200 MIG 3g.71gb", gonvml.SUCCESS },
			GetMemoryInfo_v2Func: func() (gonvml.Memory_v2, gonvml.Return) {
				used := uint64(0)
				if j == 0 {
					used = 3 * GiB
				}
				return gonvml.Memory_v2{Total: 20 * GiB, Used: used, Free: 20*GiB - used}, gonvml.SUCCESS
			},
			GetComputeRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) {
				if j == 0 {
					return []gonvml.ProcessInfo{{Pid: 7000, UsedGpuMemory: 3 * GiB, GpuInstanceId: 1, ComputeInstanceId: 0}}, gonvml.SUCCESS
				}
				return nil, gonvml.SUCCESS
			},
			GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED },
		}
		migs = append(migs, m)
	}
	d.GetMigDeviceHandleByIndexFunc = func(j int) (gonvml.Device, gonvml.Return) {
		if j < len(migs) {
			return migs[j], gonvml.SUCCESS
		}
		return nil, gonvml.ERROR_NOT_FOUND
	}
}
