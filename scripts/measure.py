"""Measure a running exporter from outside, and stand in for what it
watches, for the scripts that measure it (standard library only).

  measure.py scrapes URL PID N [plain|gzip|keepalive|gzip-keepalive]
                                            N sequential scrapes: latency, CPU per scrape, RSS;
                                            a new connection each (urllib), or one kept open
                                            (keepalive: as Prometheus scrapes)
  measure.py idle PID SECONDS               CPU of PID over SECONDS without scrapes
  measure.py table RESULTS.jsonl            compare_peers.sh's table, in Markdown
  measure.py apiserver PORT [PODS] [NODE]   a Kubernetes API server serving one node's pods
                                            (rss.sh's pod watch; see apiserver below)
  measure.py clients N SOCKET CLIENT_DIR UUID [SPACING]
                                            N stand-in clients reporting a constant allocator
                                            state (idle.sh without a GPU; see clients below)
  perf script | measure.py perf-fold [--folded FILE]
                                            samples summed by what they were doing; FILE gets
                                            one line per stack (profile.sh)

Each measuring command prints one JSON object. CPU is read two ways:
utime+stime (+ children) from /proc/PID/stat, in clock ticks of 10 ms, and
the sum of /proc/PID/task/*/schedstat, in nanoseconds, where the kernel has
it (the finer of the two; the figures in docs/benchmarks.md are schedstat's)."""
import collections
import glob
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

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


# apiserver: a Kubernetes API server that serves one node's pods and nothing else,
# for measuring the exporter's pod watch (its RSS on a node of 110 pods,
# scripts/rss.sh) without a cluster. It answers what client-go's pod
# informer asks: the list, the watch, and the watch-list stream
# (sendInitialEvents, then the bookmark that ends it). Nothing changes, so
# a watch stays open until the client closes it. Each pod looks like one
# the kubelet runs: two containers with environment, volumes, statuses and
# managed fields (about 7 KB of JSON).
# It writes a kubeconfig for it to stdout's first line's path
# ($TMPDIR/fake-apiserver-PORT.kubeconfig).


def container(name, i):
    return {
        "name": name,
        "image": "registry.example.com/team/%s:v1.%d" % (name, i),
        "command": ["python", "-m", "train", "--config", "/etc/job/config.yaml"],
        "env": [{"name": "VAR_%d" % k, "value": "value-%d-%d" % (i, k)} for k in range(12)],
        "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "64Gi"}, "requests": {"cpu": "8", "memory": "64Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "gpumem", "mountPath": "/run/gpumem"}],
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
    }


def pod(i, node):
    uid = "%08x-0000-4000-8000-%012x" % (i, i)
    names = ["trainer", "sidecar"]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "job-%d-worker" % i,
            "namespace": "team-%d" % (i % 7),
            "uid": uid,
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"app": "job-%d" % i, "team": "team-%d" % (i % 7), "pod-template-hash": "7d9f8c6b5"},
            "annotations": {"example.com/owner": "someone@example.com", "example.com/cost-center": "ml-%d" % (i % 13)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "job-%d" % i, "uid": uid, "controller": True}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:00Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:team": {}}},
                                                        "f:spec": {"f:containers": {"k:{\"name\":\"%s\"}" % n: {".": {}, "f:image": {}, "f:env": {}} for n in names}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:05Z", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:podIP": {}, "f:startTime": {}}}},
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [container(n, i) for n in names],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-%d" % i}},
                        {"name": "gpumem", "csi": {"driver": "gpumem.csi.example.com"}}],
            "restartPolicy": "Never",
            "serviceAccountName": "default",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.%d.%d.%d" % (i // 65536 % 256, i // 256 % 256, i % 256),
            "startTime": "2026-12-01T10:00:01Z",
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-12-01T10:00:04Z"}
                           for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [{
                "name": n, "ready": True, "restartCount": 0, "started": True,
                "image": "registry.example.com/team/%s:v1.%d" % (n, i),
                "imageID": "registry.example.com/team/%s@sha256:%064x" % (n, i),
                "containerID": "containerd://%064x" % (i * 2 + k),
                "state": {"running": {"startedAt": "2026-12-01T10:00:03Z"}},
            } for k, n in enumerate(names)],
        },
    }


class APIHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    node = ""
    items = []
    stop = threading.Event()

    def log_message(self, *args):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunk(self, obj):
        data = json.dumps(obj).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self):
        u = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        if u.path != "/api/v1/pods" or q.get("fieldSelector") != "spec.nodeName=" + self.node:
            self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
            return
        if q.get("watch") not in ("true", "1"):
            self.send_json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "2000"}, "items": self.items})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if q.get("sendInitialEvents") == "true":
            for p in self.items:
                self.chunk({"type": "ADDED", "object": p})
            self.chunk({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {
                "resourceVersion": "2000", "annotations": {"k8s.io/initial-events-end": "true"}}}})
        # Nothing changes: hold the watch until its timeout or the client
        # goes away.
        self.stop.wait(float(q.get("timeoutSeconds", "300")))
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


def apiserver(port, pods=110, node="gpu-node-1"):
    APIHandler.node = node
    APIHandler.items = [pod(i, node) for i in range(pods)]
    path = os.path.join(tempfile.gettempdir(), "fake-apiserver-%d.kubeconfig" % port)
    with open(path, "w") as f:
        f.write("""apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:%d"}}]
users: [{name: fake, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
current-context: fake
""" % port)
    print(path, flush=True)
    print("%d pods of node %s, %d bytes of JSON" % (pods, node, len(json.dumps(APIHandler.items))), file=sys.stderr, flush=True)
    srv = ThreadingHTTPServer(("127.0.0.1", port), APIHandler)
    srv.daemon_threads = True
    try:
        srv.serve_forever()
    finally:
        APIHandler.stop.set()


# clients: N processes that report a constant allocator state for one GPU
# through the Python client (a stand-in source, no framework needed),
# started SPACING seconds apart, until killed. For measuring the daemon at
# rest on a machine without a GPU (the simulated backend; UUID one of its
# GPUs). CLIENT_DIR holds the gpumem package (clients/python, or another
# version's copy).
def client_child(sock, pkg, uuid):
    sys.path.insert(0, pkg)
    from gpumem import client, sources

    class Constant(sources.Source):
        name = "pytorch"

        def loaded(self):
            return sys

        def version(self):
            return "0"

        def _entries(self, mod):
            return [{"uuid": uuid, "reserved_bytes": 1 << 30, "active_bytes": 1 << 29}]

    client.Client(socket_path=sock, sources=[Constant()]).start()
    while True:
        time.sleep(60)


def clients(n, sock, pkg, uuid, spacing=0.63):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally below
    kids = []
    try:
        for _ in range(n):
            kids.append(subprocess.Popen([sys.executable, __file__, "client-child", sock, pkg, uuid]))
            time.sleep(spacing)
        while True:
            time.sleep(60)
    finally:
        for k in kids:
            k.kill()


# perf-fold: `perf script` output folded into one line per stack (root
# first, frames joined by ';', then the sample count), and the samples
# summed by what they were doing: the first rule (in order) whose pattern
# appears in a stack names it (profile.sh).
PERF_RULES = [
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


def perf_fold(folded_out=None):
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
        for name, pats in PERF_RULES:
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


def main():
    a = sys.argv[1:]
    cmd = a[0] if a else "--help"
    if cmd == "scrapes" and len(a) >= 4:
        mode = a[4] if len(a) > 4 else "plain"
        if mode not in ("plain", "gzip", "keepalive", "gzip-keepalive"):
            sys.exit(__doc__)
        res = scrapes(a[1], int(a[2]), int(a[3]), mode.startswith("gzip"), mode.endswith("keepalive"))
    elif cmd == "idle" and len(a) == 3:
        res = idle(int(a[1]), float(a[2]))
    elif cmd == "table" and len(a) == 2:
        table(a[1])
        return
    elif cmd == "apiserver" and 2 <= len(a) <= 4:
        apiserver(int(a[1]), int(a[2]) if len(a) > 2 else 110, a[3] if len(a) > 3 else "gpu-node-1")
        return
    elif cmd == "clients" and 5 <= len(a) <= 6:
        clients(int(a[1]), a[2], a[3], a[4], float(a[5]) if len(a) > 5 else 0.63)
        return
    elif cmd == "perf-fold" and (len(a) == 1 or (len(a) == 3 and a[1] == "--folded")):
        perf_fold(a[2] if len(a) == 3 else None)
        return
    elif cmd == "client-child" and len(a) == 4:
        client_child(a[1], a[2], a[3])
        return
    elif cmd in ("-h", "--help"):
        print(__doc__)
        return
    else:
        sys.exit(__doc__)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
