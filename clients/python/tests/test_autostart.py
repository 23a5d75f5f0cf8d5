"""Zero-code mode (autostart/sitecustomize.py) and `python -m gpumem`, each
in a fresh interpreter."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

from tests import PACKAGE_ROOT
from tests.helpers import GpumemTestCase, wait_until

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
           "gpumem_before": "gpumem" in sys.modules}
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

    def run_python(self, args, pythonpath, **env):
        e = dict((k, v) for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP"))
        e.update(env)
        e["PYTHONPATH"] = os.pathsep.join(pythonpath)
        p = subprocess.run([sys.executable] + args, cwd=self.tmp, env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=20, universal_newlines=True)
        return p


class SitecustomizeTest(SubprocessTestCase):
    def probe(self, pythonpath=None, **env):
        p = self.run_python(["-c", PROBE], pythonpath or [AUTOSTART, self.mods], **env)
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
        shutil.copy(os.path.join(AUTOSTART, "sitecustomize.py"), os.path.join(data, "sitecustomize.py"))
        os.symlink(os.path.join(data, "sitecustomize.py"), os.path.join(root, "autostart", "sitecustomize.py"))
        shutil.copytree(os.path.join(PACKAGE_ROOT, "gpumem"), os.path.join(root, "gpumem"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        self.assertTrue(self.probe([os.path.join(root, "autostart"), self.mods], PROBE_IMPORT="1")["running"])

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

    def test_send(self):
        self.write_torch(initialized=True)
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 1000, "server": "t"})
        p = self.run_python(["-m", "gpumem", "--import", "torch", "--send"], [PACKAGE_ROOT, self.mods])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('"server": "t"', p.stderr)
        wait_until(lambda: d.messages("stats"), what="stats")
        self.assertEqual([m["type"] for m in d.messages()], ["hello", "stats"])
