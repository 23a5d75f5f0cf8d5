"""What NVML alone costs, measured from Python through ctypes, so that it
needs nothing beyond the standard library and the driver's
libnvidia-ml.so.1.

  python3 scripts/gpu/nvml.py idle [SECONDS]
      The floor of a poll's CPU at rest: this process makes only the NVML
      calls a poll of gpumem_exporter makes (device count, memory info v2,
      compute and graphics process lists of every device) once a second
      for SECONDS (default 30), sleeping between, and prints its CPU over
      that time as a percentage of one core, and the wall time of one
      round of calls (idle.sh runs it).
  python3 scripts/gpu/nvml.py rss [FLAGS]
      What NVML costs a process in memory: RSS (anonymous and
      file-backed) of a fresh Python process before NVML, after dlopen,
      after nvmlInitWithFlags(FLAGS), after reading every device's memory
      and process lists and after nvmlSystemGetCudaDriverVersion (which
      may load libcuda); then the largest mappings, the largest anonymous
      ones each on its own, and RSS after glibc's malloc_trim(0) (whether
      the memory NVML took is freed heap that glibc kept, or live). FLAGS
      0 (the default) is plain nvmlInit_v2; 2 is NVML_INIT_FLAG_NO_ATTACH
      (the GPUs are not attached at init)."""
import ctypes
import resource
import sys
import time

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


def idle(seconds=30):
    init()
    hs = handles()
    m = MemV2()
    cpu = cpu_seconds

    def round_of_calls():
        device_count()
        for h in hs:
            memory_info(h, m)
            processes(h)
            processes(h, graphics=True)

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


def rss_now():
    out = {}
    for line in open("/proc/self/status"):
        k = line.split(":")[0]
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(line.split()[1]) / 1024.0
    return out


def show(step, flags):
    r = rss_now()
    libcuda = any("libcuda" in l for l in open("/proc/self/maps"))
    print("flags=%d %-26s RSS %6.1f MiB  anon %6.1f  file %6.1f  libcuda mapped: %s" % (
        flags, step, r["VmRSS"], r["RssAnon"], r["RssFile"], libcuda), flush=True)


def top_mappings(n=8):
    maps, cur = [], None
    for line in open("/proc/self/smaps"):
        f = line.split()
        if "-" in f[0] and len(f) >= 5 and not line.startswith(("Rss", "Size")) and ":" not in f[0]:
            cur = [f[5] if len(f) > 5 else "[anon]", 0]
            maps.append(cur)
        elif f[0] == "Rss:" and cur is not None:
            cur[1] = int(f[1])
    agg = {}
    for name, kb in maps:
        agg[name] = agg.get(name, 0) + kb
    for name, kb in sorted(agg.items(), key=lambda x: -x[1])[:n]:
        print("   %8.1f MiB  %s" % (kb / 1024.0, name))


def rss(flags=0):
    show("before NVML", flags)
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    show("after dlopen", flags)
    rc = nvml.nvmlInit_v2() if flags == 0 else nvml.nvmlInitWithFlags(flags)
    assert rc == 0, rc
    show("after init", flags)
    n = ctypes.c_uint()
    nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
    for i in range(n.value):
        h = ctypes.c_void_p()
        assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
        mem = (ctypes.c_ulonglong * 8)()
        mem[0] = (2 << 24) | 40  # nvmlMemory_v2 version
        nvml.nvmlDeviceGetMemoryInfo_v2(h, mem)
        cnt = ctypes.c_uint(64)
        infos = (ctypes.c_ulonglong * (64 * 6))()
        rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), infos)
        print("device %d: used %d MiB, processes rc=%d count=%d" % (i, mem[4] >> 20, rc, cnt.value))
    show("after device queries", flags)
    v = ctypes.c_int()
    nvml.nvmlSystemGetCudaDriverVersion(ctypes.byref(v))
    show("after GetCudaDriverVersion", flags)
    top_mappings()
    print("   largest anonymous mappings, one by one:")
    anon, cur = [], None
    for line in open("/proc/self/smaps"):
        f = line.split()
        if "-" in f[0] and ":" not in f[0] and len(f) >= 5:
            cur = [f[0], f[1], f[5] if len(f) > 5 else "[anon]", 0]
            anon.append(cur)
        elif f[0] == "Rss:" and cur is not None:
            cur[3] = int(f[1])
    for rng, perms, name, kb in sorted((m for m in anon if m[2] in ("[anon]", "[heap]")), key=lambda m: -m[3])[:5]:
        lo, hi = (int(x, 16) for x in rng.split("-"))
        print("   %8.1f MiB resident of %8.1f MiB  %s %s" % (kb / 1024.0, (hi - lo) / 1048576.0, perms, name))
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc_trim(0)
    show("after malloc_trim(0)", flags)


def main():
    a = sys.argv[1:]
    if a and a[0] == "idle" and len(a) <= 2:
        idle(int(a[1]) if len(a) > 1 else 30)
    elif a and a[0] == "rss" and len(a) <= 2:
        rss(int(a[1]) if len(a) > 1 else 0)
    elif a and a[0] in ("-h", "--help"):
        print(__doc__)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
