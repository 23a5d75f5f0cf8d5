"""gpumem: report framework allocator statistics to gpumem_exporter.

    import gpumem
    gpumem.start()

starts one daemon thread that pushes PyTorch (and JAX, CuPy where loaded)
allocator statistics over a Unix socket. Configuration: GPUMEM_SOCKET,
GPUMEM_INTERVAL, GPUMEM_DISABLE. Standard library only.
"""

from ._version import __version__
from .client import collect, start, stop

__all__ = ["start", "stop", "collect", "__version__"]
