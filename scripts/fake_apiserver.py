"""A Kubernetes API server that serves one node's pods and nothing else,
for measuring the exporter's pod watch (its RSS on a node of 110 pods,
scripts/rss.sh) without a cluster. It answers what client-go's pod
informer asks: the list, the watch, and the watch-list stream
(sendInitialEvents, then the bookmark that ends it). Nothing changes, so
a watch stays open until the client closes it. Each pod looks like one
the kubelet runs: two containers with environment, volumes, statuses and
managed fields (about 7 KB of JSON).

    python3 scripts/fake_apiserver.py PORT [PODS] [NODE]

Writes a kubeconfig for it to stdout's first line's path
($TMPDIR/fake-apiserver-PORT.kubeconfig). Standard library only."""
import json
import os
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PORT = int(sys.argv[1])
PODS = int(sys.argv[2]) if len(sys.argv) > 2 else 110
NODE = sys.argv[3] if len(sys.argv) > 3 else "gpu-node-1"
STOP = threading.Event()


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


def pod(i):
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
            "nodeName": NODE,
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


ITEMS = [pod(i) for i in range(PODS)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

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
        if u.path != "/api/v1/pods" or q.get("fieldSelector") != "spec.nodeName=" + NODE:
            self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
            return
        if q.get("watch") not in ("true", "1"):
            self.send_json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "2000"}, "items": ITEMS})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if q.get("sendInitialEvents") == "true":
            for p in ITEMS:
                self.chunk({"type": "ADDED", "object": p})
            self.chunk({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {
                "resourceVersion": "2000", "annotations": {"k8s.io/initial-events-end": "true"}}}})
        # Nothing changes: hold the watch until its timeout or the client
        # goes away.
        STOP.wait(float(q.get("timeoutSeconds", "300")))
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


def main():
    path = os.path.join(tempfile.gettempdir(), "fake-apiserver-%d.kubeconfig" % PORT)
    with open(path, "w") as f:
        f.write("""apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:%d"}}]
users: [{name: fake, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
current-context: fake
""" % PORT)
    print(path, flush=True)
    print("%d pods of node %s, %d bytes of JSON" % (PODS, NODE, len(json.dumps(ITEMS))), file=sys.stderr, flush=True)
    srv = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    srv.daemon_threads = True
    try:
        srv.serve_forever()
    finally:
        STOP.set()


if __name__ == "__main__":
    main()
