"""CPU memory that torch frees is kept for its next step (glibc's malloc).

torch's CPU allocator asks the C library for every tensor and hands it back when the
tensor dies. glibc serves big blocks with fresh pages from the kernel and returns them on
free (above its mmap threshold, and when more than its trim threshold is free at the top of
the heap), so a training step that allocates the same megabytes of activations as the last
one faults their pages in again: LeNet, batch 256, eager, ~13,000 page faults and a third of
its 51 ms step on this project's 2-vCPU machine (docs/performance.md, "CPU memory reuse
(torch)"). glibc raises both thresholds by itself as big blocks are freed, up to 32 MiB and
twice that, but a training loop's pattern does not get them there. polytrain sets them to
those maxima at once: blocks up to 32 MiB come from the heap, and up to 64 MiB of freed heap
is kept for the next step instead of going back to the system. The price: a process keeps
that much freed memory (its peak is unchanged); blocks above 32 MiB are mapped fresh as before.

Applied once per process, on Linux with glibc, unless the user chose glibc's thresholds
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc`` tunables in
``GLIBC_TUNABLES``) or set ``POLYTRAIN_TORCH_MALLOC=system``. Paddle and MXNet keep their own
memory pools and were measured unaffected. The thresholds are set by
:mod:`polytrain.utils.malloc` (the numpy backend sets them too).
"""

from __future__ import annotations

from polytrain.utils.malloc import MMAP_THRESHOLD
from polytrain.utils.malloc import keep_freed_memory as _keep

MODE_VAR = "POLYTRAIN_TORCH_MALLOC"  # "reuse" (the default) or "system"
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # glibc keeps this ratio when it raises them itself

_applied: str | None = None  # what keep_freed_memory decided, once per process


def keep_freed_memory() -> str:
    """Set glibc's thresholds (once per process) and say what was done: ``"reuse"``, or
    ``"system: <why not>"``."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> str:
    return _keep(MODE_VAR, TRIM_THRESHOLD)
