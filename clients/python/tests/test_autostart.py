"""Zero-code mode (autostart/sitecustomize.py) and `python -m gpumem`, each
in a fresh interpreter."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

from tests import PACKAGE_ROOT
from tests.helpers import FakeDaemon, GpumemTestCase, wait_until

AUTOSTART = os.path.join(PACKAGE_ROOT, "autostart")

STAND_IN_TORCH = textwrap.dedent('''
    import types
    __version__ = "2.11.0"
    INITIALIZED = %(initialized)r
    cuda = types.ModuleType("torch.cuda")
    _C = types.ModuleType("torch._C")
    class _Props(object):
        total_memory = 1 << 30
        uuid = "11111111-2222-3333-4444-555555555555"
    cuda.is_initialized = lambda: INITIALIZED
    cuda.device_count = lambda: 1
    cuda.memory_stats = lambda i: {"reserved_bytes.all.current": 4096}
    cuda.get_device_properties = lambda i: _Props()
    _C._cuda_hasPrimaryContext = lambda i: True
    _C._cuda_attach_out_of_memory_observer = lambda cb: None
''')

PROBE = textwrap.dedent('''
    import json, os, sys
    out = {"hook": any(getattr(f, "_gpumem_hook", False) for f in sys.meta_path),
           "gpumem_before": "gpumem" in sys.modules,
           "socket_before": "socket" in sys.modules,
           "sys_path_before": list(sys.path)}
    if os.environ.get("PROBE_IMPORT"):
        import torch
        loader = torch.__spec__.loader
        out["loader"] = type(loader).__name__
        out["loader_patched"] = "exec_module" in vars(loader)
        out["torch_ok"] = torch.cuda.device_count() == 1
        out["hook_after"] = any(getattr(f, "_gpumem_hook", False) for f in sys.meta_path)
    out["gpumem_after"] = "gpumem" in sys.modules
    c = sys.modules.get("gpumem.client")
    out["running"] = bool(c and c._client and c._client.running())
    out["chained"] = os.environ.get("CHAINED_SITECUSTOMIZE")
    out["sys_path_after"] = list(sys.path)
    out["gpumem_file"] = getattr(sys.modules.get("gpumem"), "__file__", None)
    import importlib.util
    spec = importlib.util.find_spec("tests")
    out["tests_found"] = spec and (spec.origin or list(spec.submodule_search_locations))
    if os.environ.get("PROBE_READ_ONLY_DIR"):
        try:
            open(os.path.join(os.environ["PROBE_READ_ONLY_DIR"], "probe"), "w").close()
            out["read_only"] = False
        except OSError:
            out["read_only"] = True
    if out["running"] and os.environ.get("PROBE_WAIT_CONNECTED"):
        import time
        deadline = time.time() + 10
        while time.time() < deadline and not c._client.connects:
            time.sleep(0.01)
        out["connected"] = c._client.connects > 0
    print(json.dumps(out))
''')


class SubprocessTestCase(GpumemTestCase):
    def setUp(self):
        GpumemTestCase.setUp(self)
        self.mods = os.path.join(self.tmp, "mods")
        os.mkdir(self.mods)
        self.write_torch(initialized=False)

    def write_torch(self, initialized):
        os.makedirs(os.path.join(self.mods, "torch"), exist_ok=True)
        with open(os.path.join(self.mods, "torch", "__init__.py"), "w") as f:
            f.write(STAND_IN_TORCH % {"initialized": initialized})

    def run_python(self, args, pythonpath, python=None, preexec_fn=None, **env):
        e = dict((k, v) for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP"))
        e.update(env)
        e["PYTHONPATH"] = os.pathsep.join(pythonpath)
        # A fresh interpreter does not share the test's isolation of the
        # default socket: it must be told where its daemon is.
        self.assertTrue(e.get("GPUMEM_SOCKET"), "a subprocess without GPUMEM_SOCKET could reach the host's daemon")
        p = subprocess.run([python or sys.executable] + args, cwd=self.tmp, env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60, universal_newlines=True, preexec_fn=preexec_fn)
        return p


def tree(root):
    """Every path under root, relative, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(out)


def make_read_only(root):
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o444)
        os.chmod(dirpath, 0o555)


def make_writable(root):
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)


def without_root_file_access():
    """For root: a preexec_fn that drops CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH from the bounding set, so that the exec'd child obeys
    file modes like a read-only mount. None for other users (modes apply)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork
    PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2

    def drop():
        for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

    return drop


class SitecustomizeTest(SubprocessTestCase):
    def probe(self, pythonpath=None, preexec_fn=None, **env):
        p = self.run_python(["-c", PROBE], pythonpath or [AUTOSTART, self.mods], preexec_fn=preexec_fn, **env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr, "")
        return json.loads(p.stdout)

    def test_starts_the_client_when_torch_is_imported(self):
        out = self.probe(PROBE_IMPORT="1")
        self.assertTrue(out["hook"], "the hook is installed at startup")
        self.assertFalse(out["gpumem_before"], "gpumem itself is imported only when needed")
        self.assertEqual(out["loader"], "SourceFileLoader", "the loader is left as it was")
        self.assertFalse(out["loader_patched"])
        self.assertTrue(out["torch_ok"])
        self.assertFalse(out["hook_after"], "the hook removes itself after firing")
        self.assertTrue(out["running"])

    def test_does_nothing_without_a_framework(self):
        out = self.probe()
        self.assertTrue(out["hook"])
        self.assertFalse(out["gpumem_after"])
        self.assertFalse(out["running"])

    def test_gpumem_disable(self):
        out = self.probe(PROBE_IMPORT="1", GPUMEM_DISABLE="1")
        self.assertFalse(out["hook"])
        self.assertFalse(out["running"])

    def test_daemonset_layout_gpumem_next_to_sitecustomize(self):
        d = os.path.join(self.tmp, "autostart")
        shutil.copytree(AUTOSTART, d, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(os.path.join(PACKAGE_ROOT, "gpumem"), os.path.join(d, "gpumem"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.assertTrue(self.probe([d, self.mods], PROBE_IMPORT="1")["running"])

    def test_configmap_layout_files_are_symlinks(self):
        # A ConfigMap volume holds links into a hidden ..data directory: the
        # package next to the link must be found, not only next to its target.
        root = os.path.join(self.tmp, "opt")
        data = os.path.join(self.tmp, "cm", "..data")
        os.makedirs(data)
        os.makedirs(os.path.join(root, "autostart"))
        for name in ("sitecustomize.py", "gpumem_autostart.py"):
            shutil.copy(os.path.join(AUTOSTART, name), os.path.join(data, name))
            os.symlink(os.path.join(data, name), os.path.join(root, "autostart", name))
        shutil.copytree(os.path.join(PACKAGE_ROOT, "gpumem"), os.path.join(root, "gpumem"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.assertTrue(self.probe([os.path.join(root, "autostart"), self.mods], PROBE_IMPORT="1")["running"])

    def test_only_the_hook_until_a_framework_then_no_tests_package(self):
        # The repository layout: clients/python holds gpumem/, autostart/ and
        # tests/. Neither before nor after torch is imported may `import
        # tests` find the client's tests.
        out = self.probe(PROBE_IMPORT="1")
        self.assertTrue(out["running"])
        self.assertFalse(out["socket_before"], "the hook imports nothing heavy at startup")
        self.assertEqual(out["sys_path_before"], out["sys_path_after"], "the hook changed sys.path")
        self.assertNotIn(PACKAGE_ROOT, [os.path.realpath(p) for p in out["sys_path_after"] if p])
        self.assertEqual(out["gpumem_file"], os.path.join(PACKAGE_ROOT, "gpumem", "__init__.py"))
        self.assertIsNone(out["tests_found"], "import tests finds %s" % (out["tests_found"],))

    def test_csi_layout_read_only_next_to_the_socket(self):
        # In Kubernetes the client is mounted read-only at /run/gpumem/python
        # (gpumem/ and autostart/) next to /run/gpumem/allocstats.sock.
        run = os.path.join(self.tmp, "run", "gpumem")
        python_dir = os.path.join(run, "python")
        for name in ("gpumem", "autostart"):
            shutil.copytree(os.path.join(PACKAGE_ROOT, name), os.path.join(python_dir, name),
                            ignore=shutil.ignore_patterns("__pycache__"))
        before = tree(python_dir)
        self.write_torch(initialized=True)
        sock = os.path.join(run, "allocstats.sock")
        d = FakeDaemon(sock)
        self.daemons.append(d)
        make_read_only(python_dir)
        try:
            out = self.probe([os.path.join(python_dir, "autostart"), self.mods],
                             preexec_fn=without_root_file_access(), PROBE_IMPORT="1", PROBE_WAIT_CONNECTED="1",
                             PROBE_READ_ONLY_DIR=python_dir, GPUMEM_SOCKET=sock, GPUMEM_INTERVAL="0.05")
        finally:
            make_writable(python_dir)  # else tearDown could not remove it
        if not out["read_only"]:
            self.skipTest("cannot make a directory read-only for the subprocess here")
        self.assertTrue(out["connected"], out)
        self.assertEqual(out["gpumem_file"], os.path.join(python_dir, "gpumem", "__init__.py"))
        self.assertIsNone(out["tests_found"])
        self.assertEqual(tree(python_dir), before, "the client wrote into its read-only directory")
        wait_until(lambda: d.messages("stats"), what="stats from the read-only client")

    def test_chains_to_a_shadowed_sitecustomize(self):
        other = os.path.join(self.tmp, "other")
        os.mkdir(other)
        with open(os.path.join(other, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['CHAINED_SITECUSTOMIZE'] = 'yes'\n")
        out = self.probe([AUTOSTART, self.mods, other])
        self.assertEqual(out["chained"], "yes")

    def test_reports_to_the_daemon_end_to_end(self):
        self.write_torch(initialized=True)
        d = self.daemon()
        code = "import torch, time, gpumem.client as c\n" \
               "deadline = time.time() + 10\n" \
               "while time.time() < deadline and not (c._client and c._client.connects):\n" \
               "    time.sleep(0.01)\n" \
               "time.sleep(0.2)\n"
        p = self.run_python(["-c", code], [AUTOSTART, self.mods], GPUMEM_INTERVAL="0.05")
        self.assertEqual(p.returncode, 0, p.stderr)
        wait_until(lambda: d.messages("stats"), what="stats from the subprocess")
        self.assertEqual(d.messages("stats")[0]["devices"],
                         [{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "reserved_bytes": 4096}])


class MainTest(SubprocessTestCase):
    def test_prints_what_would_be_sent(self):
        self.write_torch(initialized=True)
        p = self.run_python(["-m", "gpumem", "--import", "torch"], [PACKAGE_ROOT, self.mods])
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [json.loads(l) for l in p.stdout.splitlines()]
        self.assertEqual([m["type"] for m in lines], ["hello", "stats"])
        self.assertEqual(lines[0]["framework"], "pytorch")
        self.assertEqual(lines[1]["devices"][0]["reserved_bytes"], 4096)
        self.assertIn("not reachable", p.stderr)

    def test_says_why_no_device_is_listed(self):
        for args, initialized, says in [
            ([], False, ["no framework (torch, jax, cupy) is loaded", "--import torch --init-cuda"]),
            (["--import", "torch"], False, ["torch is loaded but has used no GPU", "--init-cuda"]),
            (["--import", "torch"], True, []),
        ]:
            self.write_torch(initialized=initialized)
            p = self.run_python(["-m", "gpumem"] + args, [PACKAGE_ROOT, self.mods])
            self.assertEqual(p.returncode, 0, p.stderr)
            for s in says:
                self.assertIn(s, p.stderr, "python -m gpumem %s" % " ".join(args))
            if not says:
                self.assertNotIn("no devices to report", p.stderr)

    def test_send(self):
        self.write_torch(initialized=True)
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 1000, "server": "t"})
        p = self.run_python(["-m", "gpumem", "--import", "torch", "--send"], [PACKAGE_ROOT, self.mods])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('"server": "t"', p.stderr)
        wait_until(lambda: d.messages("stats"), what="stats")
        self.assertEqual([m["type"] for m in d.messages()], ["hello", "stats"])
