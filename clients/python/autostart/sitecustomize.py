"""Zero-code mode for gpumem.

Put this directory on PYTHONPATH (the DaemonSet copies `gpumem/` next to this
file) and every Python process starts the gpumem client when it imports
torch, jax or cupy. Processes that never import one of them only pay for
one entry in sys.meta_path, which removes itself once it has fired.
GPUMEM_DISABLE=1 turns it off.

Python imports only the first sitecustomize on sys.path, so this one runs
the next one it shadows (Debian's, a virtualenv's) after installing the hook.
"""


def _gpumem_autostart(this_file):
    import os
    import sys
    import types

    state = sys.modules.get("_gpumem_autostart_state")
    if state is None:
        state = types.ModuleType("_gpumem_autostart_state")
        state.seen = set()
        sys.modules["_gpumem_autostart_state"] = state
    me = os.path.realpath(this_file)
    first = not state.seen
    state.seen.add(me)
    here = os.path.dirname(me)
    watched = ("torch", "jax", "cupy")

    def start():
        try:
            import gpumem

            gpumem.start()
        except Exception:
            pass

    def make_importable():
        import importlib.util

        if importlib.util.find_spec("gpumem") is not None:
            return
        # Both the file's own directory and the one its symlinks resolve
        # to: ConfigMap files are links into a hidden ..data directory.
        unresolved = os.path.dirname(os.path.abspath(this_file))
        for d in (unresolved, os.path.dirname(unresolved), here, os.path.dirname(here)):
            if os.path.isfile(os.path.join(d, "gpumem", "__init__.py")):
                sys.path.append(d)
                return

    class GpumemImportHook(object):
        """Watches the top-level imports of torch, jax and cupy; after the real
        import of one has run, removes itself and starts the client."""

        _gpumem_hook = True

        def __init__(self):
            self._finding = set()

        def find_spec(self, fullname, path=None, target=None):
            if path is not None or fullname not in watched or fullname in self._finding:
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
            start()

    def install():
        if any(getattr(f, "_gpumem_hook", False) for f in sys.meta_path):
            return
        make_importable()
        if any(name in sys.modules for name in watched):
            start()
            return
        sys.meta_path.insert(0, GpumemImportHook())

    def chain():
        import importlib.machinery
        import importlib.util

        paths = []
        for p in sys.path:
            try:
                if os.path.realpath(p or os.getcwd()) != here:
                    paths.append(p)
            except Exception:
                pass
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
        if spec is None or spec.origin is None or spec.loader is None:
            return
        origin = os.path.realpath(spec.origin)
        if origin in state.seen:
            return
        state.seen.add(origin)
        try:
            mod = importlib.util.module_from_spec(spec)
            sys.modules["_gpumem_chained_sitecustomize"] = mod
            spec.loader.exec_module(mod)
        except Exception as e:
            sys.stderr.write("Error in sitecustomize %s (run by gpumem's): %r\n" % (spec.origin, e))

    disabled = os.environ.get("GPUMEM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")
    if first and not disabled:
        try:
            install()
        except Exception:
            pass
    try:
        chain()
    except Exception:
        pass


try:
    _gpumem_autostart(__file__)
except Exception:
    pass
del _gpumem_autostart
