"""The thread count of the BLAS numpy links (OpenBLAS), set through its own C API.

Matrix products are where the numpy backend spends its time, and their threads are the
BLAS library's. The library is found among those the process has loaded (as
threadpoolctl does, without depending on it); without an OpenBLAS (another BLAS, or not
Linux) the count cannot be changed and :func:`get_threads` says so by returning None.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

_SUFFIXES = ("", "64_", "64")


@cache
def _openblas() -> list[ctypes.CDLL]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line.lower()}
    except OSError:
        return []
    libs = []
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libs


def _symbol(lib: ctypes.CDLL, name: str) -> Any:
    for suffix in _SUFFIXES:
        fn = getattr(lib, name + suffix, None)
        if fn is not None:
            return fn
    return None


def get_threads() -> int | None:
    """OpenBLAS's thread count, or None when no OpenBLAS is loaded."""
    for lib in _openblas():
        fn = _symbol(lib, "openblas_get_num_threads")
        if fn is not None:
            return int(fn())
    return None


def set_threads(n: int) -> bool:
    """Use ``n`` BLAS threads from now on; False when there is no OpenBLAS to tell."""
    done = False
    for lib in _openblas():
        fn = _symbol(lib, "openblas_set_num_threads")
        if fn is not None:
            fn(ctypes.c_int(n))
            done = True
    return done
