"""How often a GPU's memory figures change while its processes hold
steady: reads nvmlDeviceGetMemoryInfo_v2 and the compute process list of
GPU 0 every INTERVAL seconds (default 1) for SECONDS (default 60) and
prints, per field, how many reads differed from the one before and by how
much, and how often the per-process figures changed. The exporter reads
the process lists again whenever these figures change
(--nvml.process-refresh). Standard library only.
  python3 nvml_memory_changes.py [SECONDS [INTERVAL]]"""
import ctypes
import sys
import time

seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0


class MemV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


def read():
    m = MemV2()
    m.version = ctypes.sizeof(MemV2) | (2 << 24)
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m)) == 0
    infos = (ProcInfo * 256)()
    cnt = ctypes.c_uint(256)
    nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), infos)
    procs = tuple(sorted((infos[i].pid, infos[i].used) for i in range(cnt.value)))
    return (m.total, m.reserved, m.free, m.used), procs


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
