"""The thread count of the BLAS numpy links, through threadpoolctl.

Matrix products are where the numpy backend spends its time, and their threads are the
BLAS library's. threadpoolctl (scikit-learn's, well kept) finds the BLAS libraries the
process has loaded and sets their threads through each library's own C API; where it
finds none :func:`get_threads` returns None.
"""

from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits


def get_threads() -> int | None:
    """The BLAS thread count, or None when no BLAS library threadpoolctl knows is loaded."""
    counts = [int(lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas"]
    return counts[0] if counts else None


def set_threads(n: int) -> bool:
    """Use ``n`` BLAS threads from now on; False when there is no BLAS library to tell."""
    if get_threads() is None:
        return False
    threadpool_limits(limits=n, user_api="blas")
    return True
