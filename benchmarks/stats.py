"""Statistics and machine state for the benchmarks: a distribution-free confidence interval
for a median, the CPU model and the load average.

The interval is the classic order-statistic one (no assumption on the distribution of the
per-round ratios, only that the rounds are independent): the number of rounds below the true
median is Binomial(n, 1/2), so ``[x_(k), x_(n+1-k)]`` (1-based order statistics) covers it
with probability ``P(k <= B <= n-k)``. The sums are a few lines of ``math.comb`` (scipy is not
a dependency of the project).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def order_statistic_coverage(n: int, k: int) -> float:
    """Exact probability that ``[x_(k), x_(n+1-k)]`` of ``n`` independent draws of a
    continuous distribution contains its median: ``P(k <= B <= n - k)``, B ~ Bin(n, 1/2)."""
    if not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"rank {k} is not in 1..{(n + 1) // 2} for {n} values")
    inside = sum(math.comb(n, i) for i in range(k, n - k + 1))
    return inside / 2**n


@dataclass(frozen=True)
class MedianCI:
    """A median with its order-statistic interval ``[lo, hi]`` = ``[x_(k), x_(n+1-k)]``."""

    median: float
    lo: float
    hi: float
    ranks: tuple[int, int]  # 1-based order statistics of lo and hi
    coverage: float  # exact, from the binomial distribution
    confidence: float  # what was asked for; coverage < confidence only when n is too small

    def to_dict(self) -> dict[str, float | list[int]]:
        return {
            "median": self.median,
            "lo": self.lo,
            "hi": self.hi,
            "ranks": list(self.ranks),
            "coverage": self.coverage,
            "confidence": self.confidence,
        }

    def __str__(self) -> str:
        return f"{self.median:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


def median_ci(values: Sequence[float], confidence: float = 0.95) -> MedianCI:
    """The median of ``values`` and the narrowest symmetric order-statistic interval whose
    exact coverage is at least ``confidence``; with too few values for that (n < 6 at 95 %)
    the widest one, ``[min, max]``, with its (lower) coverage."""
    n = len(values)
    if n == 0:
        raise ValueError("no values: a median needs at least one")
    ordered = sorted(values)
    k = 1  # [min, max]: the widest interval
    while k + 1 <= (n + 1) // 2 and order_statistic_coverage(n, k + 1) >= confidence:
        k += 1
    return MedianCI(
        median=statistics.median(ordered),
        lo=ordered[k - 1],
        hi=ordered[n - k],
        ranks=(k, n + 1 - k),
        coverage=order_statistic_coverage(n, k),
        confidence=confidence,
    )


# -- the machine -----------------------------------------------------------------------------


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name: ``/proc/cpuinfo``'s first "model name" (Linux x86), else its
    "Hardware"/"Processor"/"cpu" line (ARM, POWER), else :func:`platform.processor`."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    for key in ("model name", "hardware", "processor", "cpu"):
        for line in cpuinfo.splitlines():
            name, sep, value = line.partition(":")
            value = value.strip()
            # x86's "processor : 0" is an index, not a name
            if sep and name.strip().lower() == key and value and not value.isdigit():
                return value
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (runnable + uninterruptible threads, exponentially
    averaged over about a minute; the benchmark's own busy threads count too), or None
    where the system does not report it."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
