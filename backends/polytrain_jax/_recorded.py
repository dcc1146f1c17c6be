"""The imperative verbs over a functional framework: a training forward pass returns a
:class:`Recorded` value (the array, and the function of the replica's trainable
parameters that recomputes it, dropout masks replayed); losses and ``scale_loss`` extend
that function; ``backward`` differentiates it with ``jax.grad``. The step verb
(:mod:`._step`) does not go through here: this path serves the contract's single verbs
(the conformance suite, hand-written loops)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from polytrain.neutral import dropout_masks

from ._net import Array, State


class Recorded:
    """A value of a recorded forward pass of replica ``replica`` of ``model``."""

    def __init__(self, value: Array, fn: Callable[[State], Array], model: Any, replica: int):
        self.value, self.fn, self.model, self.replica = value, fn, model, replica

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> Any:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return int(self.value.ndim)

    def then(self, f: Callable[[Array], Array]) -> Recorded:
        """``f`` of this value, recorded."""
        fn = self.fn
        return Recorded(f(self.value), lambda p: f(fn(p)), self.model, self.replica)

    def __mul__(self, k: Any) -> Recorded:
        return self.then(lambda v: v * k)

    __rmul__ = __mul__

    def __truediv__(self, k: Any) -> Recorded:
        return self.then(lambda v: v / k)

    def __array__(self, dtype: Any = None) -> np.ndarray:
        return np.asarray(self.value, dtype=dtype)


def value(x: Any) -> Any:
    """The array of a recorded value (anything else as it is)."""
    return x.value if isinstance(x, Recorded) else x


class ReplayedMasks:
    """Parity masks drawn at the first pass, replayed by the recomputation."""

    def __init__(self) -> None:
        self.masks: list[Array] = []
        self.calls = 0

    def __call__(self, shape: tuple[int, ...], p: float, dtype: Any) -> Array:
        if self.calls == len(self.masks):
            mask = dropout_masks.parity_mask(shape, p, np.dtype(dtype))
            self.masks.append(mask)
        mask = self.masks[self.calls]
        self.calls += 1
        return mask

    def replay(self) -> ReplayedMasks:
        again = ReplayedMasks()
        again.masks = self.masks
        return again
