"""`pip install ./clients/python` (build_backend/gpumem_build.py) and the
zero-code mode it installs through gpumem-autostart.pth."""

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

from tests import PACKAGE_ROOT
from tests.helpers import FakeDaemon
from tests.test_autostart import PROBE, SubprocessTestCase, tree
import gpumem

BACKEND = os.path.join(PACKAGE_ROOT, "build_backend", "gpumem_build.py")


def load_backend(path, name="gpumem_build_under_test"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wheel_contents(path):
    with zipfile.ZipFile(path) as zf:
        return dict((n, zf.read(n)) for n in zf.namelist())


class BackendTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpumem-build-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.backend = load_backend(BACKEND)

    def test_wheel_holds_the_package_the_hook_and_the_pth_file(self):
        name = self.backend.build_wheel(self.tmp)
        self.assertEqual(name, "gpumem-%s-py3-none-any.whl" % self.backend.version())
        files = wheel_contents(os.path.join(self.tmp, name))
        top = sorted(set(n.split("/")[0] for n in files))
        self.assertEqual(top, ["gpumem", "gpumem-%s.dist-info" % self.backend.version(), "gpumem-autostart.pth",
                               "gpumem_autostart.py"])
        self.assertEqual(sorted(n for n in files if n.startswith("gpumem/")),
                         sorted("gpumem/" + n for n in os.listdir(os.path.join(PACKAGE_ROOT, "gpumem"))
                                if n.endswith(".py")))
        with open(os.path.join(PACKAGE_ROOT, "autostart", "gpumem_autostart.py"), "rb") as f:
            self.assertEqual(files["gpumem_autostart.py"], f.read(), "the hook exists once, in autostart/")
        pth = files["gpumem-autostart.pth"].decode().splitlines()
        self.assertEqual(pth, ["import gpumem_autostart; gpumem_autostart.install()"])

    def test_record_lists_every_file_with_its_hash(self):
        name = self.backend.build_wheel(self.tmp)
        files = wheel_contents(os.path.join(self.tmp, name))
        record_name = "gpumem-%s.dist-info/RECORD" % self.backend.version()
        listed = {}
        for line in files[record_name].decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            listed[path] = (digest, size)
        self.assertEqual(sorted(listed), sorted(files))
        for path, data in files.items():
            if path == record_name:
                self.assertEqual(listed[path], ("", ""))
                continue
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            self.assertEqual(listed[path], ("sha256=" + want, str(len(data))), path)
        meta = files["gpumem-%s.dist-info/METADATA" % self.backend.version()].decode()
        self.assertIn("\nName: gpumem\n", meta)
        self.assertIn("\nRequires-Python: >=3.8\n", meta)

    def test_the_sdist_builds_the_same_wheel(self):
        sdist = self.backend.build_sdist(self.tmp)
        with tarfile.open(os.path.join(self.tmp, sdist)) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(os.path.join(self.tmp, "src"), filter="data")
            else:
                tf.extractall(os.path.join(self.tmp, "src"))
        root = os.path.join(self.tmp, "src", sdist[:-len(".tar.gz")])
        self.assertTrue(os.path.isfile(os.path.join(root, "PKG-INFO")))
        unpacked = load_backend(os.path.join(root, "build_backend", "gpumem_build.py"), "gpumem_build_from_sdist")
        self.assertEqual(unpacked.ROOT, root)
        a, b = os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")
        os.mkdir(a)
        os.mkdir(b)
        with open(os.path.join(a, self.backend.build_wheel(a)), "rb") as f1, \
                open(os.path.join(b, unpacked.build_wheel(b)), "rb") as f2:
            self.assertEqual(f1.read(), f2.read(), "wheels from the tree and from the sdist differ")


def pip_available():
    try:
        import pip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        return False
    return True


@unittest.skipUnless(pip_available(), "pip or venv is not available to this Python")
class PipInstallTest(SubprocessTestCase):
    """One virtualenv (sharing this Python's site-packages, where pip lives)
    with the package installed by pip, without network."""

    @classmethod
    def setUpClass(cls):
        cls.venv_root = tempfile.mkdtemp(prefix="gpumem-venv-")
        venv = os.path.join(cls.venv_root, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv],
                       check=True, timeout=60)
        cls.python = os.path.join(venv, "bin", "python")
        env = dict(os.environ, TMPDIR=cls.venv_root, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        cls.source_before = tree(PACKAGE_ROOT)
        cls.pip = subprocess.run([cls.python, "-m", "pip", "install", "--no-index", "--no-cache-dir",
                                  "--disable-pip-version-check", PACKAGE_ROOT], env=env, cwd=cls.venv_root,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                                 timeout=180)
        cls.source_after = tree(PACKAGE_ROOT)
        out = subprocess.run([cls.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             stdout=subprocess.PIPE, universal_newlines=True, check=True, timeout=60)
        cls.site = out.stdout.strip()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.venv_root, ignore_errors=True)

    def setUp(self):
        SubprocessTestCase.setUp(self)
        self.assertEqual(self.pip.returncode, 0, "pip install failed:\n" + self.pip.stdout)

    def test_installs_the_package_the_hook_and_the_pth_file_only(self):
        self.assertEqual(sorted(n for n in os.listdir(self.site) if not n.startswith("__pycache__")),
                         ["gpumem", "gpumem-%s.dist-info" % gpumem.__version__, "gpumem-autostart.pth",
                          "gpumem_autostart.py"])
        self.assertEqual(self.source_after, self.source_before, "building wrote into the source tree")

    def test_importing_torch_starts_the_client(self):
        self.write_torch(initialized=True)
        d = FakeDaemon(os.path.join(self.tmp, "d.sock"))
        self.daemons.append(d)
        p = self.run_python(["-c", PROBE], [self.mods], python=self.python, PROBE_IMPORT="1",
                            PROBE_WAIT_CONNECTED="1", GPUMEM_SOCKET=d.path, GPUMEM_INTERVAL="0.05")
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        out = json.loads(p.stdout)
        self.assertTrue(out["hook"], "the .pth file installs the hook at startup")
        self.assertFalse(out["gpumem_before"], "gpumem is imported only with a framework")
        self.assertFalse(out["socket_before"], "the hook imports nothing heavy")
        self.assertEqual(out["gpumem_file"], os.path.join(self.site, "gpumem", "__init__.py"))
        self.assertTrue(out["connected"], out)
        self.assertEqual(d.messages()[0]["type"], "hello")

    def test_gpumem_disable_keeps_it_off(self):
        self.write_torch(initialized=True)
        d = FakeDaemon(os.path.join(self.tmp, "d.sock"))
        self.daemons.append(d)
        p = self.run_python(["-c", PROBE], [self.mods], python=self.python, PROBE_IMPORT="1",
                            GPUMEM_SOCKET=d.path, GPUMEM_DISABLE="1")
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        out = json.loads(p.stdout)
        self.assertFalse(out["hook"])
        self.assertTrue(out["torch_ok"])
        self.assertFalse(out["gpumem_after"])
        self.assertEqual(d.conns, [])

    def test_no_framework_no_gpumem(self):
        p = self.run_python(["-c", PROBE], [self.mods], python=self.python)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        out = json.loads(p.stdout)
        self.assertTrue(out["hook"])
        self.assertFalse(out["gpumem_after"])
