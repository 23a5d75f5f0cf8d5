"""Who makes the large anonymous mapping that nvmlInit adds to a
process (issue 12: RSS with NVML loaded). Run under the bigalloc.so shim
(scripts/gpu/bigalloc.c), which logs every allocation or mapping of 1 MiB
or more, and every thread created, with a backtrace:
    LD_PRELOAD=.bin/probe/bigalloc.so python3 nvml_anon_probe.py
Prints the anonymous mappings nvmlInit_v2 added (resident size), the
logged allocations that fall inside each with their backtraces, the
threads NVML started, the libraries it loaded, and the environment
variable names libnvidia-ml's strings mention. Standard library only."""
import ctypes
import os
import re
import tempfile


def mappings():
    out, cur = {}, None
    for line in open("/proc/self/smaps"):
        f = line.split()
        if "-" in f[0] and ":" not in f[0] and len(f) >= 5:
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            cur = {"lo": lo, "hi": hi, "perms": f[1], "name": f[5] if len(f) > 5 else "[anon]", "rss": 0}
            out[(lo, hi)] = cur
        elif f[0] == "Rss:" and cur is not None:
            cur["rss"] = int(f[1])
    return out


log = tempfile.NamedTemporaryFile(delete=False)
saved = os.dup(2)
os.dup2(log.fileno(), 2)
before = mappings()
nvml = ctypes.CDLL("libnvidia-ml.so.1")
os.write(2, b"probe: nvmlInit_v2 begins\n")
rc = nvml.nvmlInit_v2()
os.write(2, b"probe: nvmlInit_v2 returned\n")
after = mappings()
os.dup2(saved, 2)
print("nvmlInit_v2 rc", rc)

text = open(log.name, errors="replace").read()
during = text.split("probe: nvmlInit_v2 begins\n", 1)[-1].split("probe: nvmlInit_v2 returned\n", 1)[0]
events = []
for block in during.split("bigalloc: end\n"):
    m = re.search(r"bigalloc: (\S+) (\d+) bytes at (0x[0-9a-f]+|\(nil\))", block)
    if m:
        addr = int(m.group(3), 16) if m.group(3).startswith("0x") else 0
        events.append((m.group(1), int(m.group(2)), addr, block[m.end():].strip().splitlines()))
print("allocations of >= 1 MiB and threads during nvmlInit_v2:", len(events))

new = [m for k, m in after.items() if k not in before]
grown = [m for k, m in after.items() if k in before and m["rss"] > before[k]["rss"] + 256]
print("\nnew or grown mappings with >= 256 KiB resident:")
for m in sorted(new + grown, key=lambda m: -m["rss"]):
    if m["rss"] < 256:
        continue
    print("  %8.1f MiB resident of %8.1f MiB  %s %x-%x %s" % (m["rss"] / 1024, (m["hi"] - m["lo"]) / 1048576, m["perms"], m["lo"], m["hi"], m["name"]))
    if m["name"] in ("[anon]", "[heap]"):
        # the mapping right before it names its owner when it is a .bss
        prev = max((o for o in after.values() if o["hi"] <= m["lo"]), key=lambda o: o["hi"], default=None)
        if prev is not None:
            print("      just after: %s %s" % (prev["perms"], prev["name"]))
        for what, size, addr, frames in events:
            if m["lo"] <= addr < m["hi"]:
                print("      %s of %d bytes at %x:" % (what, size, addr))
                for fr in frames[2:12]:
                    print("         " + fr)
print("\nthreads started during nvmlInit_v2:")
for what, size, addr, frames in events:
    if what == "pthread_create":
        print("   start routine %x; called from:" % addr)
        for fr in frames[2:6]:
            print("         " + fr)
print("\nlibraries loaded by nvmlInit_v2:")
for name in sorted({m["name"] for m in new if m["name"].startswith("/")}):
    print("  ", name)

lib = next((m["name"] for m in after.values() if "libnvidia-ml" in m["name"]), None)
if lib:
    data = open(lib, "rb").read()
    names = sorted({s.decode() for s in re.findall(rb"\b(__?[A-Z][A-Z0-9_]{4,}|NVML_[A-Z0-9_]{3,}|CUDA_[A-Z0-9_]{3,})\x00", data)})
    print("\nupper-case names in %s (candidate environment variables): %d" % (lib, len(names)))
    print("  " + " ".join(n for n in names if not n.startswith(("NVML_ERROR", "NVML_FEATURE", "NVML_CLOCK", "NVML_DEVICE", "NVML_VGPU", "NVML_GPU_", "NVML_NVLINK", "NVML_PCIE", "NVML_FI_")))[:4000])
os.unlink(log.name)
