"""Time N sequential scrapes of an exporter and the CPU it spends on them.
Usage: scrape_bench.py URL PID [N]"""
import statistics
import sys
import time
import urllib.request

url, pid = sys.argv[1], int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
tick = 100.0  # os.sysconf('SC_CLK_TCK') on Linux


def cpu():
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / tick  # utime stime cutime cstime


def rss():
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


urllib.request.urlopen(url, timeout=10).read()
c0 = cpu()
times = []
size = 0
for _ in range(n):
    t = time.perf_counter()
    size = len(urllib.request.urlopen(url, timeout=10).read())
    times.append(time.perf_counter() - t)
c1 = cpu()
times.sort()
print("scrapes=%d p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f max_ms=%.2f cpu_ms_per_scrape=%.2f rss_mib=%.1f bytes=%d" % (
    n, 1000 * statistics.median(times), 1000 * times[int(0.9 * n) - 1], 1000 * times[int(0.99 * n) - 1],
    1000 * times[-1], 1000 * (c1 - c0) / n, rss(), size))
