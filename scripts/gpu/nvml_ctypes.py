"""The NVML calls the measuring scripts here make, through ctypes, so
that they need nothing beyond the standard library and the driver's
libnvidia-ml.so.1:
    import nvml_ctypes as nv
    nv.init(); h = nv.handles()[0]; m = nv.memory_info(h)"""
import ctypes
import resource

lib = None


class MemV2(ctypes.Structure):  # nvmlMemory_v2_t
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2/v3)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


def init():
    """Loads and initialises NVML once; returns the library."""
    global lib
    if lib is None:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert lib.nvmlInit_v2() == 0
    return lib


def device_count():
    n = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0
    return n.value


def handles():
    """A handle for each GPU, in NVML's order."""
    out = []
    for i in range(device_count()):
        h = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
        out.append(h)
    return out


def memory_info(h, m=None):
    """nvmlDeviceGetMemoryInfo_v2 into m (a MemV2, reused if given)."""
    if m is None:
        m = MemV2()
    m.version = ctypes.sizeof(MemV2) | (2 << 24)
    assert lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m)) == 0
    return m


_infos = (ProcInfo * 256)()


def processes(h, graphics=False):
    """(pid, used bytes) of the compute (or graphics) processes on h, at
    most 256, as the list call returns them."""
    call = lib.nvmlDeviceGetGraphicsRunningProcesses_v3 if graphics else lib.nvmlDeviceGetComputeRunningProcesses_v3
    cnt = ctypes.c_uint(len(_infos))
    call(h, ctypes.byref(cnt), _infos)
    return [(_infos[i].pid, _infos[i].used) for i in range(min(cnt.value, len(_infos)))]


def cpu_seconds():
    """This process's CPU time so far, user and system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
