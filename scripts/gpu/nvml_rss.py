"""What NVML costs a process in memory: RSS (anonymous and file-backed)
of this Python process before NVML, after nvmlInit, after reading every
device's memory and process lists, and after nvmlSystemGetCudaDriverVersion
(which may load libcuda). Standard library only; prints one line a step."""
import ctypes


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
    print("%-28s RSS %6.1f MiB  anon %6.1f  file %6.1f  libcuda mapped: %s" % (step, r["VmRSS"], r["RssAnon"], r["RssFile"], libcuda))


show("before NVML")
nvml = ctypes.CDLL("libnvidia-ml.so.1")
show("after dlopen")
assert nvml.nvmlInit_v2() == 0
show("after nvmlInit")
n = ctypes.c_uint()
nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
for i in range(n.value):
    h = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
    buf = ctypes.create_string_buffer(96)
    nvml.nvmlDeviceGetUUID(h, buf, 96)
    mem = (ctypes.c_ulonglong * 8)()
    cnt = ctypes.c_uint(64)
    infos = (ctypes.c_ulonglong * (64 * 6))()
    nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), infos)
show("after device queries")
v = ctypes.c_int()
nvml.nvmlSystemGetCudaDriverVersion(ctypes.byref(v))
show("after GetCudaDriverVersion")
print("cuda driver version", v.value)
