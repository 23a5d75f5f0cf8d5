// Package scenario scripts the GPU memory of a simulated 8-GPU H200 node:
// processes whose allocator and NVML figures move the way PyTorch's do, in
// named workloads (steady training, a list-append leak, evaluation without
// torch.no_grad(), growth to OOM, fragmentation, a sudden spike, a large idle
// cache, a multi-rank job, and one for each other cause of an OOM: a small
// per-process limit, a request larger than the GPU, a load beside another
// process's cache, one worker too many for the contexts, fragmentation that
// fails) or a mix of them.
//
// The memory model is the one docs/metrics.md describes, as measured on an
// H200 (docs/validation.md):
//
//   - per process: NVML used = context + reserved, where context is the CUDA
//     context (520 MiB) plus library workspaces and NCCL buffers;
//   - per allocator: reserved = active + inactive, reserved is a whole number
//     of 2 MiB pages, allocated <= active, and part of inactive sits in split
//     segments (inactive_split) that a flush of the cache cannot return;
//   - a retry is a cudaMalloc that failed and succeeded after the allocator
//     flushed its unsplit cached segments; an OOM is one that did not (it
//     counts a retry too, as PyTorch does), and carries the allocator's
//     figures at the failure, as the client reads them in PyTorch's OOM
//     observer;
//   - per GPU: used = sum of the processes' used + unattributed, and
//     used <= total - the driver's reservation.
//
// A Node is deterministic: the same scenario and seed give the same state at
// the same simulated time, however the time was cut into Advance calls. A
// test runs a simulated day in milliseconds; a daemon calls Advance once per
// poll with the time since the last one.
//
// Training processes run in steps. Active memory is a sawtooth: it sits at
// the step's floor (weights, gradients, optimizer state and whatever the
// program keeps) while the next batch loads, climbs to the step's peak in the
// forward pass and falls back in the backward pass. The allocator reserves
// for each step's peak (plus what fragmentation wastes) before the step runs,
// so reserved >= active at every instant. A process that raises an uncaught
// out-of-memory error lingers a few seconds and exits; its job starts again
// after a back-off with new pids, fresh counters and freshly drawn
// parameters, so a long run holds many independent runs of each workload.
package scenario
