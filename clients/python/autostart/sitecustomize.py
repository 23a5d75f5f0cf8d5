"""Zero-code mode for gpumem.

Put this directory on PYTHONPATH and every Python process starts the gpumem
client when it imports torch, jax or cupy (the hook is gpumem_autostart.py,
next to this file; `pip install` runs the same hook from a .pth file). The
gpumem package is loaded from `gpumem/` next to this file or one directory
above it, without adding either directory to sys.path. GPUMEM_DISABLE=1
turns it off.

Python imports only the first sitecustomize on sys.path, so this one runs
the next one it shadows (Debian's, a virtualenv's) after installing the hook.
"""

try:
    import gpumem_autostart as _gpumem_autostart

    _gpumem_autostart.install(__file__)
    _gpumem_autostart.run_shadowed_sitecustomize(__file__)
except Exception:
    pass
