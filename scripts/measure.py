"""Measure a running exporter from outside (standard library only).

  measure.py scrapes URL PID N [plain|gzip|keepalive|gzip-keepalive]
                                            N sequential scrapes: latency, CPU per scrape, RSS;
                                            a new connection each (urllib), or one kept open
                                            (keepalive: as Prometheus scrapes)
  measure.py idle PID SECONDS               CPU of PID over SECONDS without scrapes
  measure.py table RESULTS.jsonl            compare_peers.sh's table, in Markdown

Each measuring command prints one JSON object. CPU is read two ways:
utime+stime (+ children) from /proc/PID/stat, in clock ticks of 10 ms, and
the sum of /proc/PID/task/*/schedstat, in nanoseconds, where the kernel has
it (the finer of the two; the figures in docs/benchmarks.md are schedstat's)."""
import glob
import http.client
import json
import statistics
import sys
import time
import urllib.parse
import urllib.request

TICK = 0.01  # seconds per clock tick: os.sysconf('SC_CLK_TCK') is 100 on Linux


def ticks(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # utime stime cutime cstime


def sched_ns(pid):
    total = 0
    for path in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            total += int(open(path).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total or None


def rss_mib(pid, field="VmRSS:"):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(field):
            return int(line.split()[1]) / 1024.0
    return 0.0


def cpu(pid):
    return ticks(pid), sched_ns(pid)


def delta_ms(before, after, n):
    t = (after[0] - before[0]) * TICK * 1000 / n
    s = None
    if before[1] is not None and after[1] is not None:
        s = (after[1] - before[1]) / 1e6 / n
    return t, s


def scrapes(url, pid, n, gzip, keepalive=False):
    headers = {"Accept-Encoding": "gzip"} if gzip else {}
    if keepalive:
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)

        def get():
            conn.request("GET", u.path or "/", headers=headers)
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError("HTTP %d" % r.status)
            return body
    else:
        get = lambda: urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30).read()
    get()
    c0 = cpu(pid)
    times, size = [], 0
    for _ in range(n):
        t = time.perf_counter()
        size = len(get())
        times.append(time.perf_counter() - t)
    c1 = cpu(pid)
    times.sort()
    t, s = delta_ms(c0, c1, n)
    return {
        "scrapes": n, "gzip": gzip, "keepalive": keepalive, "bytes": size,
        "p50_ms": 1000 * statistics.median(times), "p90_ms": 1000 * times[int(0.9 * n) - 1],
        "p99_ms": 1000 * times[int(0.99 * n) - 1], "max_ms": 1000 * times[-1],
        "cpu_ms_per_scrape_ticks": t, "cpu_ms_per_scrape_sched": s, "rss_mib": rss_mib(pid),
        "rss_anon_mib": rss_mib(pid, "RssAnon:"), "rss_file_mib": rss_mib(pid, "RssFile:"),
    }


def idle(pid, seconds):
    c0 = cpu(pid)
    time.sleep(seconds)
    c1 = cpu(pid)
    t, s = delta_ms(c0, c1, 1)
    # ms of CPU over the window, as a percentage of one core
    return {"seconds": seconds, "cpu_pct_ticks": t / (10 * seconds),
            "cpu_pct_sched": None if s is None else s / (10 * seconds), "rss_mib": rss_mib(pid)}


def fmt(v, unit="", digits=2):
    if v is None:
        return "n/a"
    return ("%." + str(digits) + "f%s") % (v, unit)


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    r = {}
    for row in rows:
        r[(row["exporter"], row["processes"], row["what"])] = row
    ours, peer = "gpumem_exporter", "nvidia_gpu_exporter"
    out = ["| | gpumem_exporter | nvidia_gpu_exporter (NVML, per-process on) | peer / ours |", "|---|---|---|---|"]

    def line(label, key, what, procs, unit, digits=2, ratio=True):
        a = r.get((ours, procs, what), {}).get(key)
        b = r.get((peer, procs, what), {}).get(key)
        q = "%.0fx" % (b / a) if ratio and a and b else ""
        out.append("| %s | %s | %s | %s |" % (label, fmt(a, unit, digits), fmt(b, unit, digits), q))

    for procs in sorted({k[1] for k in r}):
        p = "%d process%s" % (procs, "" if procs == 1 else "es")
        for what, label in (("plain", ""), ("gzip", ", gzip"), ("keepalive", ", kept-alive connection"),
                            ("gzip-keepalive", ", gzip, kept-alive connection")):
            line("%s%s: p50" % (p, label), "p50_ms", what, procs, " ms")
            line("%s%s: p99" % (p, label), "p99_ms", what, procs, " ms")
            line("%s%s: CPU per scrape (utime+stime)" % (p, label), "cpu_ms_per_scrape_ticks", what, procs, " ms")
            line("%s%s: CPU per scrape (schedstat)" % (p, label), "cpu_ms_per_scrape_sched", what, procs, " ms", 3)
            line("%s%s: body" % (p, label), "bytes", what, procs, " B", 0, False)
        line("%s: RSS after the scrapes" % p, "rss_mib", "plain", procs, " MiB", 1, False)
        line("%s: idle CPU, no scrapes (utime+stime)" % p, "cpu_pct_ticks", "idle", procs, "% of a core", 3, False)
        line("%s: idle CPU, no scrapes (schedstat)" % p, "cpu_pct_sched", "idle", procs, "% of a core", 4, False)
    print("\n".join(out))


def main():
    cmd = sys.argv[1]
    if cmd == "scrapes":
        mode = sys.argv[5] if len(sys.argv) > 5 else "plain"
        if mode not in ("plain", "gzip", "keepalive", "gzip-keepalive"):
            sys.exit(__doc__)
        res = scrapes(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), mode.startswith("gzip"), mode.endswith("keepalive"))
    elif cmd == "idle":
        res = idle(int(sys.argv[2]), float(sys.argv[3]))
    elif cmd == "table":
        table(sys.argv[2])
        return
    else:
        sys.exit(__doc__)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
