"""Dropout mask sources for a training forward pass (``Context.mask``).

* the framework's own masks: :class:`KeyMasks`, from a ``jax.random`` key per forward pass
  (``fold_in`` of the call index), so a recomputation of the same pass draws the same masks;
* polytrain's parity masks (``--dropout-masks parity``): drawn in numpy, in call order, by
  :func:`polytrain.neutral.dropout_masks.parity_mask` *before* a compiled step runs (their
  shapes found once per input shape by ``jax.eval_shape``) and passed in as arguments:
  :class:`GivenMasks` hands them out in order inside the trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from polytrain.errors import BackendError
from polytrain.neutral import dropout_masks

from ._net import Array


class KeyMasks:
    """Inverted dropout masks from ``key``: call ``i`` draws from ``fold_in(key, i)``."""

    def __init__(self, key: Array) -> None:
        self.key, self.calls = key, 0

    def __call__(self, shape: tuple[int, ...], p: float, dtype: Any) -> Array:
        sub = jax.random.fold_in(self.key, self.calls)
        self.calls += 1
        if p >= 1.0:
            return jnp.zeros(shape, dtype)
        zero, one = np.float32(0), np.float32(1)  # not float64 under the scoped x64 flag
        keep = jax.random.uniform(sub, shape, jnp.float32, zero, one) >= np.float32(p)
        return keep.astype(dtype) / jnp.asarray(1.0 - p, dtype)


class GivenMasks:
    """The masks of a forward pass, given in call order (parity masks)."""

    def __init__(self, masks: Sequence[Array]) -> None:
        self.masks, self.calls = list(masks), 0

    def __call__(self, shape: tuple[int, ...], p: float, dtype: Any) -> Array:
        if self.calls >= len(self.masks):
            raise BackendError("jax backend: more dropout calls than parity masks drawn.")
        mask = self.masks[self.calls]
        self.calls += 1
        return mask


class ShapeRecorder:
    """Records each dropout call's shape and rate (under ``jax.eval_shape``)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], float]] = []

    def __call__(self, shape: tuple[int, ...], p: float, dtype: Any) -> Array:
        self.calls.append((tuple(int(n) for n in shape), float(p)))
        return jnp.ones(shape, dtype)


def dropout_calls(run: Callable[[ShapeRecorder], Any]) -> list[tuple[tuple[int, ...], float]]:
    """The dropout calls of a forward pass (``run(recorder)`` traces it abstractly)."""
    recorder = ShapeRecorder()
    jax.eval_shape(lambda: run(recorder))
    return recorder.calls


def parity_masks(calls: Sequence[tuple[tuple[int, ...], float]], dtype: Any) -> list[np.ndarray]:
    """The parity masks of these calls, drawn now in order (empty outside a parity step)."""
    if not dropout_masks.parity_active():
        return []
    masks = [dropout_masks.parity_mask(shape, p, dtype) for shape, p in calls]
    return [m for m in masks if m is not None]
