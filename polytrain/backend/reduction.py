"""A loss's reduction over its samples (``"mean"``, ``"sum"``, ``"none"``), for any
framework's tensor: the check and the choice are the same everywhere, and the only
operations it needs (``.sum()``, ``.shape``, division) every tensor type has."""

from __future__ import annotations

from typing import Any

from polytrain.errors import BackendError

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(reduction: str) -> None:
    """Stop on a reduction that is not one of :data:`REDUCTIONS`."""
    if reduction not in REDUCTIONS:
        raise BackendError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")


def reduce_samples(per_sample: Any, reduction: str, count: Any = None) -> Any:
    """``per_sample`` itself (``"none"``), its sum, or its sum over ``count`` (``"mean"``;
    by default the number of samples, the first axis)."""
    check_reduction(reduction)
    if reduction == "none":
        return per_sample
    total = per_sample.sum()
    if reduction == "sum":
        return total
    return total / (per_sample.shape[0] if count is None else count)
