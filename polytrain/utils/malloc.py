"""CPU memory a backend frees is kept for its next step (glibc's malloc thresholds).

A backend that allocates its activations through the C library (torch's CPU allocator,
numpy) hands them back when they die. glibc serves a block above its mmap threshold with
fresh pages from the kernel and unmaps it on free, and gives the top of its heap back once
more than its trim threshold is free there, so a training step that allocates the same
megabytes as the last one faults their pages in again (docs/performance.md, "CPU memory
reuse (torch)" and "The main job's time"). :func:`keep_freed_memory` sets the mmap
threshold to glibc's largest (32 MiB: blocks up to it come from the heap) and the trim
threshold to what the backend asks (freed heap up to it stays in the process). The price:
a process keeps that much freed memory (its peak is unchanged).

Once per process and threshold: a later call never lowers a trim threshold set before (the
lockstep of ``polytrain compare`` creates several backends in one process). Not on
anything but Linux with glibc, nor where the user chose glibc's thresholds
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc`` tunables in
``GLIBC_TUNABLES``), nor where the backend's variable says ``system``.
"""

from __future__ import annotations

import ctypes
import os
import platform

from polytrain.errors import BackendError

MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic mmap threshold (64-bit)
_M_TRIM_THRESHOLD = -1  # mallopt parameters, <malloc.h>
_M_MMAP_THRESHOLD = -3
_USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_trim_set = 0  # the largest trim threshold set in this process


def keep_freed_memory(mode_var: str, trim_threshold: int) -> str:
    """Set glibc's thresholds unless ``mode_var`` (e.g. ``POLYTRAIN_TORCH_MALLOC``) is
    ``system`` or the user chose them; says what was done: ``"reuse"``, or
    ``"system: <why not>"``."""
    global _trim_set
    mode = os.environ.get(mode_var, "reuse").strip().lower()
    if mode not in ("reuse", "system"):
        raise BackendError(f"{mode_var} must be 'reuse' or 'system', got {mode!r}.")
    if mode == "system":
        return f"system: {mode_var}=system"
    chosen = [v for v in _USER_VARS if v in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        chosen.append("GLIBC_TUNABLES")
    if chosen:
        return f"system: the user set {', '.join(chosen)}"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "system: not Linux with glibc"
    if trim_threshold <= _trim_set:
        return "reuse"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    ):
        return "system: glibc refused the thresholds"
    _trim_set = trim_threshold
    return "reuse"
