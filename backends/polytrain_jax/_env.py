"""What must be set before jax is imported: XLA reads ``XLA_FLAGS`` once, when its CPU
client starts. The backend factory calls :func:`before_import` first (its
``reserve_threads`` hook, as the other plugins set their thread variables).

* Emulated devices: ``cpu:K`` is XLA host device K, and their number is fixed then:
  ``--xla_force_host_platform_device_count`` is ``$POLYTRAIN_JAX_DEVICES`` (default 8)
  unless ``XLA_FLAGS`` already names a count. A device beyond it is one line naming the
  variable.
* Threads: one thread (``--threads 1``) turns Eigen's multi-threading off; otherwise XLA
  sizes its pool to the machine. The count polytrain resolved is kept for the run header.
"""

from __future__ import annotations

import os
import sys

DEVICES_ENV = "POLYTRAIN_JAX_DEVICES"
DEFAULT_DEVICES = 8
COUNT_FLAG = "--xla_force_host_platform_device_count"
THREADS: int | None = None  # the thread count exported when jax was imported


def xla_flags(flags: str, devices: int, threads: int | None) -> str:
    """``flags`` with the host device count (unless named) and the one-thread flags."""
    parts = flags.split()
    if not any(p.startswith(COUNT_FLAG) for p in parts):
        parts.append(f"{COUNT_FLAG}={devices}")
    if threads == 1 and not any(p.startswith("--xla_cpu_multi_thread_eigen") for p in parts):
        parts += ["--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"]
    return " ".join(parts)


def before_import() -> int:
    """Set ``XLA_FLAGS`` for the thread count just exported (``OMP_NUM_THREADS``) unless
    jax is loaded already; returns the threads to reserve (none)."""
    global THREADS
    text = os.environ.get("OMP_NUM_THREADS", "")
    THREADS = int(text) if text.isdigit() else None
    if "jax" in sys.modules:
        return 0
    count = os.environ.get(DEVICES_ENV, "")
    devices = int(count) if count.isdigit() and int(count) > 0 else DEFAULT_DEVICES
    os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""), devices, THREADS)
    return 0
