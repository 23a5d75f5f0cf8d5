package attribution

import "github.com/gpumem/gpumem_exporter/nvmlpoll"

// PIDsToLabel is every pid a row of the join can carry, without
// duplicates: those snap lists and those that report allocator stats
// (reporting). The workload cache resolves them after each poll.
func PIDsToLabel(snap *nvmlpoll.Snapshot, reporting []uint32) []uint32 {
	listed := snap.PIDs()
	seen := make(map[uint32]struct{}, len(listed)+len(reporting))
	out := make([]uint32, 0, len(listed)+len(reporting))
	for _, s := range [][]uint32{listed, reporting} {
		for _, p := range s {
			if _, ok := seen[p]; !ok {
				seen[p] = struct{}{}
				out = append(out, p)
			}
		}
	}
	return out
}
