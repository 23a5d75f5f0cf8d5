package nvmlpoll

// KnownDevice matches a UUID against the devices of the latest snapshot
// and gives the device's NVML spelling and total memory (0 when unknown):
// what the allocator server checks a reported device against.
func (p *Poller) KnownDevice(uuid string) (string, uint64, bool) {
	d, ok := p.Snapshot().Device(uuid)
	if !ok {
		return "", 0, false
	}
	var total uint64
	if d.HasMemory {
		total = d.Memory.Total
	}
	return d.UUID, total, true
}

// ListedOn tells whether s lists pid on the device uuid, for the allocator
// store's DropUnlisted. It answers true when it cannot tell: the device's
// process list could not be read, or sees says that this NVML cannot list
// pid at all (sees nil: it can list every pid; the simulated node lists
// only its own processes).
func (s *Snapshot) ListedOn(sees func(pid uint32) bool) func(pid uint32, uuid string) bool {
	return func(pid uint32, uuid string) bool {
		if sees != nil && !sees(pid) {
			return true
		}
		d, ok := s.Device(uuid)
		if !ok {
			return false
		}
		if !d.HasProcesses {
			return true
		}
		for _, p := range d.Processes {
			if p.PID == pid {
				return true
			}
		}
		return false
	}
}
