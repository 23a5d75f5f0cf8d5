"""What NVML costs a process in memory: RSS (anonymous and file-backed)
of a fresh Python process before NVML, after dlopen, after
nvmlInitWithFlags(FLAGS), after reading every device's memory and process
lists and after nvmlSystemGetCudaDriverVersion (which may load libcuda);
then the largest mappings, the largest anonymous ones each on its own,
and RSS after glibc's malloc_trim(0) (whether the memory NVML took is
freed heap that glibc kept, or live). FLAGS 0 (the default) is plain
nvmlInit_v2; 2 is NVML_INIT_FLAG_NO_ATTACH (the GPUs are not attached at
init). Standard library only.   python3 nvml_rss.py [FLAGS]"""
import ctypes
import sys


def rss():
    out = {}
    for line in open("/proc/self/status"):
        k = line.split(":")[0]
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(line.split()[1]) / 1024.0
    return out


def show(step):
    r = rss()
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


flags = int(sys.argv[1]) if len(sys.argv) > 1 else 0
show("before NVML")
nvml = ctypes.CDLL("libnvidia-ml.so.1")
show("after dlopen")
rc = nvml.nvmlInit_v2() if flags == 0 else nvml.nvmlInitWithFlags(flags)
assert rc == 0, rc
show("after init")
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
show("after device queries")
v = ctypes.c_int()
nvml.nvmlSystemGetCudaDriverVersion(ctypes.byref(v))
show("after GetCudaDriverVersion")
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
show("after malloc_trim(0)")
