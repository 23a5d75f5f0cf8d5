"""Test helpers: a fake daemon on a real Unix socket and framework stand-ins."""

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import types
import unittest

from tests import PACKAGE_ROOT  # noqa: F401  (puts gpumem on sys.path)

import gpumem.client
from gpumem import _oom, _paragraph, config


# The default socket the client ships with. Tests never look there: a daemon
# running on the host must not receive what a test sends.
SHIPPED_DEFAULT_SOCKET = config.DEFAULT_SOCKET

ISOLATED_ENV = ("XDG_RUNTIME_DIR", "TMPDIR")


class HostIsolation(object):
    """Points every place the client looks for a daemon by default into
    root, a test's own directory: config.DEFAULT_SOCKET, $XDG_RUNTIME_DIR
    and $TMPDIR (GPUMEM_* variables are the test case's business). restore()
    puts back what it found."""

    def __init__(self, root):
        self.default_socket = os.path.join(root, "run", "gpumem", "allocstats.sock")
        self.xdg_runtime_dir = os.path.join(root, "xdg")
        self.tmpdir = os.path.join(root, "tmp")
        for d in (os.path.dirname(self.default_socket), self.xdg_runtime_dir, self.tmpdir):
            os.makedirs(d, mode=0o700)
        self._saved_default = config.DEFAULT_SOCKET
        self._saved_env = dict((k, os.environ.get(k)) for k in ISOLATED_ENV)
        config.DEFAULT_SOCKET = self.default_socket
        os.environ["XDG_RUNTIME_DIR"] = self.xdg_runtime_dir
        os.environ["TMPDIR"] = self.tmpdir

    def restore(self):
        config.DEFAULT_SOCKET = self._saved_default
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_until(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(0.01)


class FakeDaemon(object):
    """Listens on a Unix stream socket; records every line every connection
    sends, as (connection number, raw bytes, parsed dict).

    read=False accepts connections and never reads from them (with a small
    receive buffer), to play a daemon that is stuck."""

    def __init__(self, path, welcome=None, read=True, verdict=None):
        self.path = path
        self.welcome = welcome
        # verdict: a function of an oom message giving the line (bytes) or
        # message (dict) to answer it with, or None.
        self.verdict = verdict
        self.read = read
        self.lines = []
        self.conns = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if not read:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.listener.bind(path)
        self.listener.listen(16)
        self.listener.settimeout(0.02)
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                n = len(self.conns)
                self.conns.append(conn)
            if self.read:
                t = threading.Thread(target=self._serve, args=(n, conn), daemon=True)
                self._threads.append(t)
                t.start()

    def _serve(self, n, conn):
        conn.settimeout(0.02)
        buf = b""
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line.decode("utf-8"))
                with self._lock:
                    self.lines.append((n, line, msg))
                answer = None
                if msg.get("type") == "hello" and self.welcome is not None:
                    answer = (json.dumps(self.welcome) + "\n").encode()
                elif msg.get("type") == "oom" and self.verdict is not None:
                    answer = self.verdict(msg)
                    if isinstance(answer, dict):
                        answer = (json.dumps(answer) + "\n").encode()
                if answer:
                    try:
                        conn.sendall(answer)
                    except OSError:
                        return

    def messages(self, type=None, conn=None):
        with self._lock:
            return [m for n, _, m in self.lines
                    if (type is None or m.get("type") == type) and (conn is None or n == conn)]

    def raw_lines(self):
        with self._lock:
            return [line for _, line, _ in self.lines]

    def close(self):
        self._stop.set()
        try:
            self.listener.close()
        except OSError:
            pass
        for t in self._threads:
            t.join(1.0)
        with self._lock:
            for c in self.conns:
                try:
                    c.close()
                except OSError:
                    pass
        try:
            os.unlink(self.path)
        except OSError:
            pass


class CudaUUID(object):
    """Like torch's _CUuuid: str() gives the dashed hex form."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


def uuid_for(i):
    return "%08x-0000-4000-8000-%012x" % (0xABCD0000 + i, i)


class StandInTorch(object):
    """Builds a `torch` module tree with the CUDA API the client uses and
    records every call into torch.cuda / torch._C as (name, device)."""

    def __init__(self, devices, initialized=True, fraction=None, with_has_context=True, version="2.11.0"):
        # devices: {index: {"stats": dict, "context": bool, "uuid": str|None, "total": int}}
        self.devices = devices
        self.initialized = initialized
        self.fraction = fraction
        self.calls = []
        self.observers = []
        self.fail_stats = False
        torch = types.ModuleType("torch")
        torch.__version__ = version
        cuda = types.ModuleType("torch.cuda")
        C = types.ModuleType("torch._C")
        torch.cuda = cuda
        torch._C = C
        cuda.is_initialized = lambda: self._call("is_initialized", None, self.initialized)
        cuda.device_count = lambda: self._call("device_count", None, len(self.devices))
        cuda.memory_stats = self._memory_stats
        cuda.get_device_properties = self._props
        if fraction is not None:
            cuda.get_per_process_memory_fraction = lambda i: self._call("fraction", i, self.fraction)
        if with_has_context:
            C._cuda_hasPrimaryContext = lambda i: self._call("hasPrimaryContext", i, self.devices[i].get("context", True))
        C._cuda_attach_out_of_memory_observer = self._attach
        self.queued = []  # torch.cuda._lazy_call's queue
        cuda._lazy_call = self._lazy_call
        self.module = torch

    def _lazy_call(self, fn):
        if self.initialized:
            fn()
        else:
            self.queued.append(fn)

    def init_cuda(self):
        """As torch.cuda._lazy_init: initialise, then run the queued calls."""
        self.initialized = True
        queued, self.queued = self.queued, []
        for fn in queued:
            fn()

    def _call(self, name, device, result):
        self.calls.append((name, device))
        return result

    def _memory_stats(self, i):
        self.calls.append(("memory_stats", i))
        if self.fail_stats:
            raise RuntimeError("boom")
        return dict(self.devices[i].get("stats", {}))

    def _props(self, i):
        self.calls.append(("get_device_properties", i))
        d = self.devices[i]
        props = types.SimpleNamespace(name="Stand-in H200", total_memory=d.get("total", 150754820096))
        if d.get("uuid", "") is not None:
            props.uuid = CudaUUID(d.get("uuid") or uuid_for(i))
        return props

    def _attach(self, cb):
        self.calls.append(("attach_oom_observer", None))
        self.observers.append(cb)

    def queried(self, device):
        return [name for name, d in self.calls if d == device and name != "hasPrimaryContext"]


def torch_stats(reserved, active=None, allocated=None, **extra):
    active = reserved if active is None else active
    allocated = active if allocated is None else allocated
    s = {
        "reserved_bytes.all.current": reserved,
        "active_bytes.all.current": active,
        "allocated_bytes.all.current": allocated,
        "inactive_split_bytes.all.current": 0,
        "reserved_bytes.all.peak": reserved,
        "active_bytes.all.peak": active,
        "num_alloc_retries": 0,
        "num_ooms": 0,
        "requested_bytes.all.current": allocated,
    }
    s.update(extra)
    return s


class GpumemTestCase(unittest.TestCase):
    """Clean module state around each test: no framework modules, an empty OOM
    queue, no global client, no GPUMEM_* variables but GPUMEM_SOCKET (a
    socket in the test's temp dir), and every default socket location in
    that temp dir too (HostIsolation)."""

    FRAMEWORKS = ("torch", "jax", "jax._src", "jax._src.xla_bridge", "cupy")

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpumem-test-")
        self.sock = os.path.join(self.tmp, "a.sock")
        self.host = HostIsolation(self.tmp)
        self._saved_modules = dict((k, sys.modules.get(k)) for k in self.FRAMEWORKS)
        for k in self.FRAMEWORKS:
            sys.modules.pop(k, None)
        self._saved_env = dict((k, v) for k, v in os.environ.items() if k.startswith("GPUMEM_"))
        for k in list(self._saved_env):
            del os.environ[k]
        os.environ["GPUMEM_SOCKET"] = self.sock
        os.environ["GPUMEM_OOM_MESSAGE"] = "0"  # verdicts are checked, not printed
        _oom.events.clear()
        _oom.wake = None
        _oom.registered_to = None
        _oom.queued_to = None
        config._warned_interval = False
        _paragraph.reset_after_fork()  # a fresh writer: nothing held, full buckets
        self.clients = []
        self.daemons = []

    def tearDown(self):
        gpumem.client.stop(2.0)
        for c in self.clients:
            c.stop(2.0)
        for d in self.daemons:
            d.close()
        for k in self.FRAMEWORKS:
            sys.modules.pop(k, None)
            if self._saved_modules.get(k) is not None:
                sys.modules[k] = self._saved_modules[k]
        for k in [k for k in os.environ if k.startswith("GPUMEM_")]:
            del os.environ[k]
        os.environ.update(self._saved_env)
        _oom.events.clear()
        _oom.wake = None
        _oom.registered_to = None
        _oom.queued_to = None
        self.host.restore()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def daemon(self, **kw):
        d = FakeDaemon(self.sock, **kw)
        self.daemons.append(d)
        return d

    def client(self, start=True, **kw):
        kw.setdefault("socket_path", self.sock)
        kw.setdefault("interval", 0.05)
        kw.setdefault("backoff_initial", 0.02)
        kw.setdefault("backoff_max", 0.1)
        c = gpumem.client.Client(**kw)
        self.clients.append(c)
        if start:
            c.start()
        return c

    def install_torch(self, devices, **kw):
        t = StandInTorch(devices, **kw)
        sys.modules["torch"] = t.module
        return t
