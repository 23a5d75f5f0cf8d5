// Package nvmlpoll reads GPU and per-process memory from NVML in one polling
// goroutine and publishes it as immutable snapshots. The poller reads an
// nvml.Interface: the real library (go-nvml), or the simulated node of
// package simulate, built on go-nvml's dgxh200 mock.
package nvmlpoll

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// MIG modes as exported in the mig_mode label.
const (
	MIGEnabled     = "enabled"
	MIGDisabled    = "disabled"
	MIGUnsupported = "unsupported"
)

// Snapshot is one complete poll of NVML. It is never modified after it is
// published, so readers need no lock.
type Snapshot struct {
	Time              time.Time
	DriverVersion     string
	CUDADriverVersion string // "13.0"
	// Devices holds physical GPUs in NVML index order, each followed by its
	// MIG instances when MIG is enabled.
	Devices []Device
}

// Device is a physical GPU or a MIG instance.
type Device struct {
	Index      int    // NVML index of the physical GPU (also for its MIG instances)
	UUID       string // GPU-… or MIG-…
	ParentUUID string // the physical GPU's UUID for a MIG instance, else ""
	Name       string
	PCIBusID   string
	MIGMode    string // MIGEnabled, MIGDisabled or MIGUnsupported; "" for a MIG instance

	// HasMemory is false when the memory query failed this poll.
	HasMemory bool
	Memory    Memory
	// HasProcesses is false when the process lists could not be read.
	HasProcesses bool
	Processes    []Process
}

// Memory is NVML's memory info. With the v2 call, Reserved is the driver's own
// reservation and is not part of Used; with the v1 fallback HasReserved is
// false and Used includes it.
type Memory struct {
	Total       uint64
	Free        uint64
	Used        uint64
	Reserved    uint64
	HasReserved bool
}

// Process is one process holding a context on a device.
type Process struct {
	PID uint32
	// HasUsed is false when NVML could not report the process's memory
	// (NVML_VALUE_NOT_AVAILABLE, e.g. under some virtualisation modes).
	HasUsed   bool
	UsedBytes uint64
	// PeakBytes is the highest UsedBytes the poller saw since the process
	// appeared on this device.
	PeakBytes uint64
	// Name is NVML's process name, a fallback when /proc has none.
	Name string
	// Compute and Graphics say in which of NVML's lists the process appears.
	Compute  bool
	Graphics bool
}

// GPULabel is the value of the gpu label: the NVML index of the physical GPU.
func (d *Device) GPULabel() string { return strconv.Itoa(d.Index) }

// ExportsMemory reports whether memory and process series are exported for
// the device. A physical GPU in MIG mode does not: its memory and processes
// are exported per MIG instance, so that sum() never counts them twice.
func (d *Device) ExportsMemory() bool { return d.MIGMode != MIGEnabled }

// ProcessUsedSum is the sum of the listed processes' used bytes.
func (d *Device) ProcessUsedSum() uint64 {
	var sum uint64
	for _, p := range d.Processes {
		sum += p.UsedBytes
	}
	return sum
}

// Unattributed is the device's used memory not accounted for by any listed
// process, never below zero.
func (d *Device) Unattributed() uint64 {
	sum := d.ProcessUsedSum()
	if sum >= d.Memory.Used {
		return 0
	}
	return d.Memory.Used - sum
}

// Device returns the device with the given UUID. The match ignores case
// and the GPU-/MIG- prefix: CUDA names a MIG instance by the same 16 bytes
// that NVML spells MIG-…, and clients can only prefix them with GPU-.
func (s *Snapshot) Device(uuid string) (*Device, bool) {
	if s == nil {
		return nil, false
	}
	want := uuidBody(uuid)
	for i := range s.Devices {
		if strings.EqualFold(uuidBody(s.Devices[i].UUID), want) {
			return &s.Devices[i], true
		}
	}
	return nil, false
}

func uuidBody(uuid string) string {
	if len(uuid) > 4 && (strings.EqualFold(uuid[:4], "GPU-") || strings.EqualFold(uuid[:4], "MIG-")) {
		return uuid[4:]
	}
	return uuid
}

// PIDs returns every pid listed on any device, without duplicates.
func (s *Snapshot) PIDs() []uint32 {
	if s == nil {
		return nil
	}
	seen := make(map[uint32]struct{})
	var pids []uint32
	for i := range s.Devices {
		for _, p := range s.Devices[i].Processes {
			if _, ok := seen[p.PID]; !ok {
				seen[p.PID] = struct{}{}
				pids = append(pids, p.PID)
			}
		}
	}
	return pids
}

// SameReadings reports whether s and o read the same: the same devices
// with the same memory figures and processes. Only Time may differ. Two
// nil snapshots read the same; a nil and a non-nil one do not.
func (s *Snapshot) SameReadings(o *Snapshot) bool {
	if s == nil || o == nil {
		return s == o
	}
	if s.DriverVersion != o.DriverVersion || s.CUDADriverVersion != o.CUDADriverVersion || len(s.Devices) != len(o.Devices) {
		return false
	}
	for i := range s.Devices {
		a, b := &s.Devices[i], &o.Devices[i]
		if a.Index != b.Index || a.UUID != b.UUID || a.ParentUUID != b.ParentUUID || a.Name != b.Name || a.PCIBusID != b.PCIBusID ||
			a.MIGMode != b.MIGMode || a.HasMemory != b.HasMemory || a.Memory != b.Memory || a.HasProcesses != b.HasProcesses ||
			!slices.Equal(a.Processes, b.Processes) {
			return false
		}
	}
	return true
}
