"""argparse types for the numeric flags that are not recipe fields: each parses and checks
its range, so a bad value stops at parsing with one line (``argument --threads: must be
..., got X``, exit 2) before any framework is imported. Recipe fields are checked by
``Recipe.__post_init__`` instead, so the Python API gets the same checks.

NaN and infinity are refused by every float type here."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from polytrain.training.recipe import SEED_MAX
from polytrain.utils.threads import max_threads


def int_in(lo: int, hi: int | None = None, why: str = "") -> Callable[[str], int]:
    """An integer in ``lo..hi`` (``hi`` None: no upper bound); ``why`` explains the range."""
    span = f">= {lo}" if hi is None else f"in {lo}..{hi}"
    note = f" ({why})" if why else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be an integer {span}{note}, got {text!r}")
        return value

    parse.__name__ = f"integer {span}"
    return parse


def finite_float(
    lo: float | None = None, *, lo_open: bool = False, hi: float | None = None, why: str = ""
) -> Callable[[str], float]:
    """A finite float ``>= lo`` (``> lo`` with ``lo_open``; ``lo`` None: any finite), at
    most ``hi`` (None: no upper bound)."""
    span = "" if lo is None else f" {'>' if lo_open else '>='} {lo:g}"
    span += "" if hi is None else f" and <= {hi:g}"
    note = f" ({why})" if why else ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        below = lo is not None and (value < lo or (lo_open and value == lo))
        if below or not math.isfinite(value) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be a finite number{span}{note}, got {text!r}")
        return value

    parse.__name__ = f"finite number{span}"
    return parse


positive_int = int_in(1)
non_negative_int = int_in(0)
positive_float = finite_float(0, lo_open=True)
non_negative_float = finite_float(0)
# A week: far longer waits overflow the timers (threading: "timestamp out of range").
seconds = finite_float(0, lo_open=True, hi=7 * 24 * 3600, why="seconds")
seed = int_in(0, SEED_MAX, why="numpy's seed range")


def thread_count(text: str) -> int:
    """Threads per process: 1 .. 4 per CPU of this machine (PyTorch crashed with 100000)."""
    limit = max_threads()
    return int_in(1, limit, why="4 per CPU; far more crashes PyTorch's thread pool")(text)
