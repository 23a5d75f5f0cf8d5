"""The PEP 517 build backend of the gpumem package, standard library only.

pyproject.toml names it with an empty `requires`, so `pip install
./clients/python` needs no network and no setuptools or wheel package. It
builds one pure-Python wheel holding:

- gpumem/                 the package;
- gpumem_autostart.py     the zero-code import hook (from autostart/);
- gpumem-autostart.pth    one line that site.py runs at every interpreter
                          start and that installs that hook.

autostart/sitecustomize.py is not installed: a sitecustomize in
site-packages would fight with the distribution's. The package's metadata
lives here (there is no [project] table); the version comes from
gpumem/_version.py. No editable installs (no build_editable).
"""

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NAME = "gpumem"
SUMMARY = "Report PyTorch, JAX and CuPy allocator statistics to gpumem_exporter"
REQUIRES_PYTHON = ">=3.8"
CLASSIFIERS = (
    "Programming Language :: Python :: 3",
    "Operating System :: POSIX :: Linux",
)
TAG = "py3-none-any"

# What the sdist carries, relative to ROOT (directories recursively).
SDIST_PATHS = ("pyproject.toml", "README.md", "gpumem-autostart.pth", "build_backend", "gpumem", "autostart", "tests")


def version():
    with open(os.path.join(ROOT, "gpumem", "_version.py")) as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if m is None:
        raise RuntimeError("no __version__ in gpumem/_version.py")
    return m.group(1)


def metadata():
    lines = ["Metadata-Version: 2.1", "Name: " + NAME, "Version: " + version(), "Summary: " + SUMMARY,
             "Requires-Python: " + REQUIRES_PYTHON]
    lines += ["Classifier: " + c for c in CLASSIFIERS]
    lines.append("Description-Content-Type: text/markdown")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return "\n".join(lines) + "\n\n" + readme


def wheel_files():
    """(path in the wheel, file on disk), in a stable order."""
    files = [("gpumem/" + n, os.path.join(ROOT, "gpumem", n)) for n in _sources(os.path.join(ROOT, "gpumem"))]
    files.append(("gpumem_autostart.py", os.path.join(ROOT, "autostart", "gpumem_autostart.py")))
    files.append(("gpumem-autostart.pth", os.path.join(ROOT, "gpumem-autostart.pth")))
    return files


def _sources(directory):
    return sorted(n for n in os.listdir(directory) if n.endswith(".py"))


def _timestamp():
    """SOURCE_DATE_EPOCH when set (reproducible builds), else 1980-01-01."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        return max(int(epoch), 315532800)
    return 315532800


def _zip_entry(zf, name, data, date_time):
    info = zipfile.ZipInfo(name, date_time=date_time)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "%s,sha256=%s,%d" % (name, digest, len(data))


# -- PEP 517 hooks --

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    v = version()
    dist_info = "%s-%s.dist-info" % (NAME, v)
    filename = "%s-%s-%s.whl" % (NAME, v, TAG)
    date_time = time.gmtime(_timestamp())[:6]
    entries = []
    for name, path in wheel_files():
        with open(path, "rb") as f:
            entries.append((name, f.read()))
    entries.append((dist_info + "/METADATA", metadata().encode("utf-8")))
    entries.append((dist_info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: gpumem_build\n"
                                           "Root-Is-Purelib: true\nTag: %s\n" % TAG).encode("ascii")))
    entries.append((dist_info + "/top_level.txt", b"gpumem\ngpumem_autostart\n"))
    record = [_record_line(name, data) for name, data in entries] + [dist_info + "/RECORD,,"]
    entries.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode("utf-8")))
    target = os.path.join(wheel_directory, filename)
    with zipfile.ZipFile(target, "w") as zf:
        for name, data in entries:
            _zip_entry(zf, name, data, date_time)
    return filename


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, version())
    filename = base + ".tar.gz"
    mtime = _timestamp()

    def add(tf, arcname, data):
        info = tarfile.TarInfo(arcname)
        info.size = len(data)
        info.mtime = mtime
        info.mode = 0o644
        tf.addfile(info, io.BytesIO(data))

    with gzip.GzipFile(os.path.join(sdist_directory, filename), "wb", mtime=mtime) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for rel in SDIST_PATHS:
            path = os.path.join(ROOT, rel)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    add(tf, base + "/" + rel, f.read())
                continue
            for n in _sources(path):
                with open(os.path.join(path, n), "rb") as f:
                    add(tf, "%s/%s/%s" % (base, rel, n), f.read())
        add(tf, base + "/PKG-INFO", metadata().encode("utf-8"))
    return filename
