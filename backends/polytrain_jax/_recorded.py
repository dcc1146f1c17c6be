"""The imperative verbs over a functional framework: a small lazy tape.

A training forward pass (or an op of :mod:`._ops` on a parameter) returns a
:class:`Recorded` value: the array, the *leaves* it depends on (a model replica's
parameters, or a functional :class:`Parameter`) and the function of the leaves' values
that recomputes it (dropout masks replayed). Losses, ``scale_loss`` and further ops extend
that function; ``backward`` differentiates it with ``jax.grad`` and hands each leaf its
gradient. The step verb (:mod:`._step`) does not go through here: this path serves the
contract's single verbs (the conformance suite, hand-written loops).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np

from polytrain.neutral import dropout_masks

from ._net import Array

Values = dict[int, Any]  # leaf key -> its current value (an array, or a dict of arrays)
_STATE = threading.local()


def recording() -> bool:
    """False inside :func:`no_grad`."""
    return not getattr(_STATE, "off", False)


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    before = getattr(_STATE, "off", False)
    _STATE.off = True
    try:
        yield
    finally:
        _STATE.off = before


class Leaf:
    """Something gradients flow into: ``current()`` its value, ``accumulate(grad)``."""

    def current(self) -> Any:
        raise NotImplementedError

    def accumulate(self, grad: Any) -> None:
        raise NotImplementedError


class ReplicaLeaf(Leaf):
    """The trainable parameters of one replica of a model (a dict by canonical name)."""

    def __init__(self, model: Any, replica: int) -> None:
        self.model, self.replica = model, replica

    def current(self) -> Any:
        return self.model.params[self.replica]

    def accumulate(self, grad: Any) -> None:
        self.model.add_grads(self.replica, grad)


class Parameter(Leaf):
    """A functional parameter (``ops.parameter``): a mutable holder of an array whose
    gradient, zero at first, accumulates over backward calls."""

    def __init__(self, value: Array) -> None:
        self.value, self.grad = value, jnp.zeros_like(value)

    def current(self) -> Any:
        return self.value

    def accumulate(self, grad: Any) -> None:
        self.grad = self.grad + grad

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> Any:
        return self.value.dtype

    def __array__(self, dtype: Any = None) -> np.ndarray:
        return np.asarray(self.value, dtype=dtype)


class GradHandle:
    """The gradient of a functional parameter (``ops.grad``): what d2l's in-place
    all-reduce writes into, so :meth:`set` replaces the parameter's gradient."""

    def __init__(self, param: Parameter) -> None:
        self.param = param

    @property
    def value(self) -> Array:
        return self.param.grad

    def set(self, array: Array) -> None:
        self.param.grad = array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.param.grad.shape)

    def __array__(self, dtype: Any = None) -> np.ndarray:
        return np.asarray(self.param.grad, dtype=dtype)


class Recorded:
    """A value computed from ``leaves`` by ``fn`` (of the leaves' values, by key)."""

    def __init__(self, value: Array, fn: Callable[[Values], Array], leaves: dict[int, Leaf]):
        self.value, self.fn, self.leaves = value, fn, leaves

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
        return lift(f, self)

    def __mul__(self, k: Any) -> Recorded:
        return self.then(lambda v: v * k)

    __rmul__ = __mul__

    def __truediv__(self, k: Any) -> Recorded:
        return self.then(lambda v: v / k)

    def __array__(self, dtype: Any = None) -> np.ndarray:
        return np.asarray(self.value, dtype=dtype)


def value(x: Any) -> Any:
    """The array of a recorded value or parameter (anything else as it is)."""
    return x.value if isinstance(x, Recorded | Parameter | GradHandle) else x


def _as_recorded(x: Any) -> Recorded | None:
    if isinstance(x, Recorded):
        return x
    if isinstance(x, Parameter):
        key = id(x)
        return Recorded(x.value, lambda values: values[key], {key: x})
    return None


def lift(f: Callable[..., Array], *args: Any) -> Any:
    """``f`` of the arguments' values; recorded when any argument is (and recording is on)."""
    values = [value(a) for a in args]
    out = f(*values)
    recorded = [_as_recorded(a) for a in args] if recording() else []
    if not any(r is not None for r in recorded):
        return out
    leaves: dict[int, Leaf] = {}
    for r in recorded:
        if r is not None:
            leaves |= r.leaves

    def fn(vals: Values) -> Array:
        inputs = [r.fn(vals) if r is not None else v for r, v in zip(recorded, values, strict=True)]
        return f(*inputs)

    return Recorded(out, fn, leaves)


def recorded_forward(
    leaf: ReplicaLeaf, value: Array, fn: Callable[[Any, Array], Array], x: Any, x_value: Array
) -> Recorded:
    """A model replica's forward output: ``fn(parameters, input)``; an input that is itself
    recorded (a pipeline's previous stage) stays in the recorded function."""
    key = -(id(leaf.model) * 1000 + leaf.replica)  # parameters' keys are positive ids
    upstream = x if isinstance(x, Recorded) and recording() else None
    leaves: dict[int, Leaf] = {key: leaf} | (upstream.leaves if upstream else {})

    def recompute(values: Values) -> Array:
        xin = x_value if upstream is None else upstream.fn(values).astype(x_value.dtype)
        return fn(values[key], xin)

    return Recorded(value, recompute, leaves)


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
