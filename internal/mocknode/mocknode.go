// Package mocknode is go-nvml's dgxh200 mock wired once for tests: pinned
// UUIDs and PCI bus ids, memory info v1 and v2, and process lists that a
// test sets between polls.
package mocknode

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

const (
	MiB = 1 << 20
	GiB = 1 << 30
)

// GPUUUID pins the UUID of mock GPU i (dgxh200 picks random ones).
func GPUUUID(i int) string { return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i) }

// MIGUUID pins the UUID of MIG instance j of GPU i.
func MIGUUID(i, j int) string { return fmt.Sprintf("MIG-00000000-0000-4000-9000-%06d%06d", i, j) }

// GPU is what one mock GPU reports; tests change it between polls.
type GPU struct {
	Mem   nvml.Memory_v2
	Procs []nvml.ProcessInfo
}

// Node is a dgxh200 server of n GPUs wired to GPU values. Every GPU has
// 100 GiB: 1 GiB reserved by the driver, used as set by the test. NVML
// names process pid "proc<pid>".
type Node struct {
	*server.Server
	GPUs []*GPU
}

// New returns a node of n GPUs with nothing running.
func New(n int) *Node {
	node := &Node{Server: dgxh200.NewWithGPUs(gpus.Multiple(n, gpus.H200_SXM5_141GB)...)}
	node.SystemGetProcessNameFunc = func(pid int) (string, nvml.Return) {
		return fmt.Sprintf("proc%d", pid), nvml.SUCCESS
	}
	for i := range node.Devices {
		g := &GPU{Mem: MemV2(100*GiB, 1*GiB, 0)}
		node.GPUs = append(node.GPUs, g)
		d := node.Device(i)
		d.UUID = GPUUUID(i)
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			id := fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
			for k := range id {
				p.BusId[k] = int8(id[k])
			}
			return p, nvml.SUCCESS
		}
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return g.Mem, nvml.SUCCESS }
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			// v1: used includes the driver's reservation.
			return nvml.Memory{Total: g.Mem.Total, Used: g.Mem.Used + g.Mem.Reserved, Free: g.Mem.Free}, nvml.SUCCESS
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return g.Procs, nvml.SUCCESS }
		d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	}
	return node
}

// Device returns mock device i.
func (n *Node) Device(i int) *server.Device { return n.Devices[i].(*server.Device) }

// MemV2 is NVML v2 memory info: free = total - reserved - used.
func MemV2(total, reserved, used uint64) nvml.Memory_v2 {
	return nvml.Memory_v2{Version: 2, Total: total, Reserved: reserved, Used: used, Free: total - reserved - used}
}

// SetUsed sets GPU i's processes and its used memory: their sum plus extra
// (memory no listed process accounts for).
func (n *Node) SetUsed(i int, extra uint64, procs ...nvml.ProcessInfo) {
	g := n.GPUs[i]
	used := extra
	for _, p := range procs {
		used += p.UsedGpuMemory
	}
	g.Procs = procs
	g.Mem = MemV2(g.Mem.Total, g.Mem.Reserved, used)
}

// Proc is a compute process outside MIG.
func Proc(pid uint32, used uint64) nvml.ProcessInfo {
	return nvml.ProcessInfo{Pid: pid, UsedGpuMemory: used, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}
