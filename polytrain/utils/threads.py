"""Thread settings, fixed before any framework is imported.

Importing paddle sets ``OMP_NUM_THREADS=1`` when it is unset, so without this the
thread count of torch would depend on import order; and two OpenMP pools on two cores
next to another busy process made torch ~7x slower. So: one number per process,
exported to the OpenMP/BLAS variables before the first framework import, then applied
through each framework's own setter, and reported in the run header.
"""

from __future__ import annotations

import os

from polytrain.errors import ConfigError

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


THREADS_PER_CPU = 4  # --threads 100000 segfaulted PyTorch; a few per CPU is plenty


def max_threads() -> int:
    """The most threads per process polytrain accepts: 4 per CPU of the machine."""
    return (os.cpu_count() or 1) * THREADS_PER_CPU


def resolve_threads(
    requested: int | None = None, local_processes: int = 1, reserve: int = 0
) -> int:
    """Threads per process: the request, else ``$POLYTRAIN_THREADS``, else
    ``$OMP_NUM_THREADS``, else the CPUs divided among the processes of this node, less
    ``reserve`` for threads the framework runs besides its pool (MXNet's engine)."""
    if requested is None:
        text = os.environ.get("POLYTRAIN_THREADS") or os.environ.get("OMP_NUM_THREADS")
        if text:
            try:
                requested = int(text)
            except ValueError:
                raise ConfigError(f"Thread count must be an integer, got {text!r}.") from None
    if requested is None:
        return max(1, cpu_count() // max(1, local_processes) - reserve)
    if not 1 <= requested <= max_threads():
        raise ConfigError(
            f"Thread count must be in 1..{max_threads()} ({THREADS_PER_CPU} per CPU; far more "
            f"crashes PyTorch's thread pool), got {requested}."
        )
    return requested


def export_thread_env(n: int) -> None:
    """Set the OpenMP/BLAS variables to ``n`` (before a framework import reads them)."""
    for var in THREAD_VARS:
        os.environ[var] = str(n)
