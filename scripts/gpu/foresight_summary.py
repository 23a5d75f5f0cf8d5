"""Summarises a run of scripts/gpu/foresight.sh: for each workload, when it
was warned before its OOM (in-process, from its record), when
GPUWorkloadOOMRisk would have fired (the first 15 s scrape with
gpumem_allocator_time_to_oom_seconds under 600 for its pid, plus one 15 s
evaluation), whether its checkpoint exists, the verdict, and what its
stderr printed.

    python3 scripts/gpu/foresight_summary.py OUTDIR
"""

import json
import os
import re
import sys

out = sys.argv[1]
reports = json.load(open(os.path.join(out, "oom-reports.json")))["reports"]
scrapes, t = [], None
for line in open(os.path.join(out, "scrapes.txt")):
    if line.startswith("# "):
        t = float(line[2:])
        continue
    m = re.search(r'pid="(\d+)".* (\S+)$', line.strip())
    if m and t is not None:
        scrapes.append((t, int(m.group(1)), float(m.group(2))))

print("| workload | ran | OOM after | warned before the OOM (in-process) | GPUWorkloadOOMRisk before the OOM | checkpoint | verdict | warning on stderr | verdict on stderr |")
print("|---|---|---|---|---|---|---|---|---|")
for kind in ("leak95", "leak7m", "steady", "eval", "too_large"):
    try:
        rec = json.load(open(os.path.join(out, kind + ".json")))
    except (OSError, ValueError):
        print("| %s | no record |" % kind)
        continue
    err = open(os.path.join(out, kind + ".stderr")).read()
    oom = rec.get("oom")
    end = oom or os.path.getmtime(os.path.join(out, kind + ".json"))
    warned = "-"
    if rec["warnings"]:
        w = rec["warnings"][0]
        warned = "%.0f s (eta said %.0f s)" % ((oom - w["t"]), w["eta_seconds"]) if oom else "warned (no OOM): %d" % len(rec["warnings"])
    alert = "-"
    fired = [s for s in scrapes if s[1] == rec["pid"] and s[2] < 600]
    if fired and oom:
        alert = "%.0f s" % (oom - (fired[0][0] + 15))
    elif fired:
        alert = "fired (no OOM)"
    verdict = [r["verdict"]["cause"] for r in reports if r["pid"] == rec["pid"]]
    ckpt = os.path.exists(os.path.join(out, kind + ".ckpt"))
    print("| %s | %.0f s | %s | %s | %s | %s | %s | %s | %s |" % (
        kind, end - rec["start"], "%.0f s" % (oom - rec["start"]) if oom else "no OOM", warned, alert,
        "yes" if ckpt else "no", ",".join(verdict) or "-",
        "yes" if "may run out of GPU memory" in err else "no",
        "yes" if "why CUDA ran out of memory" in err else "no"))
for r in reports:
    v = r["verdict"]
    print("\npid %d: %s (also: %s): %s First: %s" % (r["pid"], v["cause"], ",".join(v.get("contributing") or []), v["summary"], v["remedy"]))
