"""Fold `perf script` output into one line per stack (root first, frames
joined by ';', then the sample count), and sum the samples by what they
were doing: the first rule (in order) whose pattern appears in a stack
names it. Standard library only.
  perf script -i perf.data | python3 perf_fold.py [--folded FILE]"""
import collections
import sys

RULES = [
    ("NVML process lists", ("RunningProcesses",)),
    ("NVML memory info", ("GetMemoryInfo",)),
    ("NVML other calls", ("go-nvml",)),
    ("poll: the exporter's own work", ("nvmlpoll.", "workload.", "attribution.", "oom.")),
    ("allocstats connections and store", ("allocstats.",)),
    ("scrape/HTTP", ("net/http.", "exposition.", "collector.")),
    ("GC", ("gcBgMarkWorker", "bgsweep", "bgscavenge", "gcStart", "gcDrain", "forcegchelper")),
    ("sysmon", ("runtime.sysmon",)),
    ("scheduler: idle, netpoll, timers", ("runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.netpoll", "runtime.mstart")),
    ("NVML threads (not Go)", ("libnvidia-ml", "libcuda")),
]


def main():
    folded_out = None
    if len(sys.argv) > 2 and sys.argv[1] == "--folded":
        folded_out = sys.argv[2]
    stacks = collections.Counter()
    frames = []
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not line.strip():
            if frames:
                stacks[";".join(reversed(frames))] += 1
            frames = []
            continue
        if line[0] not in " \t":
            frames = []  # a sample's header: comm pid/tid time: period event:
            continue
        parts = line.strip().split(None, 1)
        sym = parts[1] if len(parts) > 1 else parts[0]
        if sym.endswith(")") and " (" in sym:  # "symbol (/path/of/object)": keep the object's file name
            name, obj = sym[:-1].rsplit(" (", 1)
            sym = "%s (%s)" % (name, obj.rsplit("/", 1)[-1])
        frames.append(sym.replace(";", ":"))
    if frames:
        stacks[";".join(reversed(frames))] += 1
    total = sum(stacks.values()) or 1
    by = collections.Counter()
    for stack, n in stacks.items():
        for name, pats in RULES:
            if any(p in stack for p in pats):
                by[name] += n
                break
        else:
            by["other"] += n
    print("%d samples" % total)
    for name, n in by.most_common():
        print("%6.1f%%  %5d  %s" % (100.0 * n / total, n, name))
    if folded_out:
        with open(folded_out, "w") as f:
            for stack, n in stacks.most_common():
                f.write("%s %d\n" % (stack, n))


main()
