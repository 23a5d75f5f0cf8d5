"""gpumem's zero-code mode: start the gpumem client in any Python process
once it imports torch, jax or cupy.

Two things call install():
- autostart/sitecustomize.py, with this directory on PYTHONPATH; gpumem is
  then loaded from the `gpumem/` directory next to sitecustomize.py or one
  directory above it;
- gpumem-autostart.pth, which `pip install` puts in site-packages next to
  this module and the installed gpumem package.

Until a watched framework is imported, the only trace in the process is one
entry in sys.meta_path: this module imports nothing but os and sys (already
loaded), adds nothing to sys.path, writes no file and never raises.
GPUMEM_DISABLE=1 (or true, yes, on) turns it off.
"""

import os
import sys

WATCHED = ("torch", "jax", "cupy")

_installed = False
_ran_sitecustomize = set()  # real paths of the sitecustomize files run


def disabled():
    return os.environ.get("GPUMEM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def install(origin=None):
    """Install the import hook, once per process. origin: the file of the
    caller next to which, or one directory above, the gpumem package lies
    (sitecustomize.py); None when gpumem is installed (the .pth file). True
    when the hook is in place or the client was started."""
    global _installed
    try:
        if _installed or disabled():
            return False
        _installed = True
        if any(getattr(f, "_gpumem_hook", False) for f in sys.meta_path):
            return False
        if any(name in sys.modules for name in WATCHED):
            _start(origin)
        else:
            sys.meta_path.insert(0, ImportHook(origin))
        return True
    except Exception:
        return False


class ImportHook(object):
    """Watches the top-level imports of torch, jax and cupy; after the real
    import of one has run, removes itself and starts the client."""

    _gpumem_hook = True

    def __init__(self, origin):
        self.origin = origin
        self._finding = set()

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname not in WATCHED or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            loader = spec.loader
            real_exec = loader.exec_module
            hook = self

            def exec_module(module):
                if getattr(module, "__name__", None) != fullname:
                    return real_exec(module)
                try:
                    loader.__dict__.pop("exec_module", None)
                except Exception:
                    pass
                real_exec(module)  # errors propagate; the hook stays
                hook.fire()

            # An instance attribute: isinstance checks, resource readers and
            # everything else about the loader stay as they were.
            loader.exec_module = exec_module
            return spec
        except Exception:
            return None  # the ordinary import goes on without us
        finally:
            self._finding.discard(fullname)

    def fire(self):
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        _start(self.origin)


def _start(origin):
    try:
        _load_gpumem(origin).start()
    except Exception:
        pass


def _load_gpumem(origin):
    """The gpumem package: the one already imported, else the one that came
    with origin, else an installed one. The one next to origin is loaded
    from its file, so that no directory goes on sys.path (the repository's
    clients/python also holds a `tests` package)."""
    mod = sys.modules.get("gpumem")
    if mod is not None:
        return mod
    if origin is not None:
        for d in _package_dirs(origin):
            package = os.path.join(d, "gpumem")
            init = os.path.join(package, "__init__.py")
            if os.path.isfile(init):
                return _load_package("gpumem", init, package)
    import gpumem

    return gpumem


def _package_dirs(origin):
    """origin's directory and the one above it, first as given, then with
    symbolic links resolved: a ConfigMap volume's files are links into a
    hidden ..data directory, so the package lies next to the link."""
    given = os.path.dirname(os.path.abspath(origin))
    real = os.path.dirname(os.path.realpath(origin))
    dirs = []
    for d in (given, os.path.dirname(given), real, os.path.dirname(real)):
        if d not in dirs:
            dirs.append(d)
    return dirs


def _load_package(name, init, package_dir):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for k in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[k]
        raise
    return module


def run_shadowed_sitecustomize(origin):
    """Python imports only the first sitecustomize on sys.path. origin is
    that one (ours): run the next one it shadows (a distribution's, a
    virtualenv's) as Python would have, errors printed to stderr."""
    try:
        _run_next_sitecustomize(origin)
    except Exception:
        pass


def _run_next_sitecustomize(origin):
    import importlib.machinery
    import importlib.util

    mine = os.path.realpath(origin)
    _ran_sitecustomize.add(mine)
    skip = (os.path.dirname(mine), os.path.dirname(os.path.abspath(origin)))
    paths = []
    for p in sys.path:
        try:
            if os.path.realpath(p or os.getcwd()) not in skip:
                paths.append(p)
        except Exception:
            pass
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.origin is None or spec.loader is None:
        return
    found = os.path.realpath(spec.origin)
    if found in _ran_sitecustomize:
        return
    _ran_sitecustomize.add(found)
    try:
        module = importlib.util.module_from_spec(spec)
        sys.modules["_gpumem_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as e:
        sys.stderr.write("Error in sitecustomize %s (run by gpumem's): %r\n" % (spec.origin, e))
