"""How often a GPU's memory figures change while its processes hold
steady: reads nvmlDeviceGetMemoryInfo_v2 and the compute process list of
GPU 0 every INTERVAL seconds (default 1) for SECONDS (default 60) and
prints, per field, how many reads differed from the one before and by how
much, and how often the per-process figures changed. The exporter reads
the process lists again whenever these figures change
(--nvml.process-refresh). Standard library only.
  python3 nvml_memory_changes.py [SECONDS [INTERVAL]]"""
import sys
import time

import nvml_ctypes as nv

seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
nv.init()
h = nv.handles()[0]


def read():
    m = nv.memory_info(h)
    return (m.total, m.reserved, m.free, m.used), tuple(sorted(nv.processes(h)))


prev_mem, prev_procs = read()
changes = {"total": [], "reserved": [], "free": [], "used": []}
proc_changes, reads = 0, 0
end = time.time() + seconds
while time.time() < end:
    time.sleep(interval)
    mem, procs = read()
    reads += 1
    for i, name in enumerate(("total", "reserved", "free", "used")):
        if mem[i] != prev_mem[i]:
            changes[name].append(mem[i] - prev_mem[i])
    if procs != prev_procs:
        proc_changes += 1
    prev_mem, prev_procs = mem, procs
print("%d reads of GPU 0 over %d s, %d processes listed" % (reads, seconds, len(prev_procs)))
for name, d in changes.items():
    print("  %-8s changed %3d times; deltas (bytes): %s" % (name, len(d), " ".join(str(x) for x in d[:12])))
print("  process list or a process's used memory changed %d times" % proc_changes)
