"""gpumem: report framework allocator statistics to gpumem_exporter.

    import gpumem
    gpumem.start()

starts one daemon thread that pushes PyTorch (and JAX, CuPy where loaded)
allocator statistics over a Unix socket. Configuration: GPUMEM_SOCKET,
GPUMEM_INTERVAL, GPUMEM_DISABLE. When the daemon foresees this process
running out of GPU memory it warns on stderr and calls the functions
registered with gpumem.on_oom_risk (GPUMEM_WARNINGS=0 silences stderr,
GPUMEM_WARN_BEFORE sets the threshold in seconds). Standard library only.
"""

from ._version import __version__
from ._warning import OOMRisk, on_oom_risk, remove_oom_risk
from .client import collect, start, stop

__all__ = ["start", "stop", "collect", "on_oom_risk", "remove_oom_risk", "OOMRisk", "__version__"]
