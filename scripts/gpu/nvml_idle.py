"""The floor of a poll's CPU at rest: this process makes only the NVML
calls a poll of gpumem_exporter makes (device count, memory info v2,
compute and graphics process lists of every device) once a second for
SECONDS (default 30), sleeping between, and prints its CPU over that time
as a percentage of one core, and the wall time of one round of calls.
Standard library only."""
import ctypes
import resource
import sys
import time

seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
n = ctypes.c_uint()
nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
handles = []
for i in range(n.value):
    h = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
    handles.append(h)


class MemV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


infos = (ctypes.c_ulonglong * (256 * 4))()


def round_of_calls():
    c = ctypes.c_uint()
    nvml.nvmlDeviceGetCount_v2(ctypes.byref(c))
    for h in handles:
        m = MemV2()
        m.version = ctypes.sizeof(MemV2) | (2 << 24)
        nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m))
        for call in (nvml.nvmlDeviceGetComputeRunningProcesses_v3, nvml.nvmlDeviceGetGraphicsRunningProcesses_v3):
            cnt = ctypes.c_uint(256)
            call(h, ctypes.byref(cnt), infos)


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


round_of_calls()
walls = []
c0 = cpu()
for _ in range(seconds):
    t = time.perf_counter()
    round_of_calls()
    walls.append(time.perf_counter() - t)
    time.sleep(1)
c1 = cpu()
walls.sort()
print("NVML data calls once a second for %d s: %.4f%% of a core (this process, Python's loop included); one round: median %.0f us, max %.0f us"
      % (seconds, 100 * (c1 - c0) / seconds, 1e6 * walls[len(walls) // 2], 1e6 * walls[-1]))
