"""A neutral spec as one pure JAX function: ``apply(state, x, ctx) -> y``.

Every layer type has a *builder* in a ``{LayerType: builder}`` table (this module's
containers and image layers, :mod:`._seq_layers` and :mod:`._rnn_layers` for the rest):
a builder takes the layer and its canonical path and returns the layer's pure function.
``state`` maps canonical names (PyTorch's, as the spec gives them) to arrays, parameters
and buffers alike, so names and layouts are canonical by construction. What is not pure
in a forward pass goes through the :class:`Context`: BatchNorm's new running statistics
(``ctx.updates``), dropout masks (``ctx.mask``) and per-layer outputs (``ctx.hook``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from polytrain.errors import BackendError
from polytrain.neutral.models import (
    Add,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    Sequential,
)
from polytrain.neutral.reference import pool_output_size

Array = Any  # a jax.Array, or a tracer of one
State = dict[str, Array]
Hook = Callable[[str, Array], None]
#: a dropout mask source: (shape, p, dtype) -> the mask to multiply by (0 or 1/(1-p))
MaskSource = Callable[[tuple[int, ...], float, Any], Array]


@dataclass
class Context:
    """What a forward pass needs besides parameters and input, and what it leaves."""

    train: bool
    mask: MaskSource | None = None  # dropout in training; None: no dropout layer may run
    updates: State = field(default_factory=dict)  # BatchNorm's new running statistics
    hook: Hook | None = None  # every leaf's (and each Residual's and Add's) output

    def dropout_mask(self, shape: tuple[int, ...], p: float, dtype: Any) -> Array:
        if self.mask is None:
            raise BackendError("jax backend: a training dropout layer ran without a mask source.")
        return self.mask(shape, p, dtype)


Apply = Callable[[State, Array, Context], Array]
Builder = Callable[[Any, str], Apply]
BUILDERS: dict[type, Builder] = {}


def registrar(table: dict[type, Any]) -> Callable[..., Callable[[Any], Any]]:
    """A decorator factory that registers a builder in ``table`` for the types it names."""

    def builds(*types: type) -> Callable[[Any], Any]:
        def register(builder: Any) -> Any:
            for t in types:
                table[t] = builder
            return builder

        return register

    return builds


#: ``@builds(LayerType)``: register a builder in :data:`BUILDERS`
builds = registrar(BUILDERS)


def builder_for(table: dict[type, Any], layer: Layer) -> Any:
    """``layer``'s builder in ``table``, None if none: a subclass of a spec layer builds as
    its base, as on the other backends."""
    return next((table[t] for t in type(layer).__mro__ if t in table), None)


def reported(apply: Apply, path: str, shown: Callable[[Array], Array] | None = None) -> Apply:
    """``apply`` with its output (``shown(y)`` when given) passed to the layer hook."""

    def apply_reported(state: State, x: Array, ctx: Context) -> Array:
        y = apply(state, x, ctx)
        if ctx.hook is not None:
            ctx.hook(path, y if shown is None else shown(y))
        return y

    return apply_reported


def key(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def build(layer: Layer, path: str = "") -> Apply:
    """The pure function of ``layer`` at ``path`` (its leaves' outputs reported to the hook)."""
    builder = builder_for(BUILDERS, layer)
    if builder is None:
        raise BackendError(
            f"The jax backend has no builder for layer type {type(layer).__name__}: "
            "see polytrain_jax.capabilities for the layer types it supports."
        )
    apply = builder(layer, path)
    return apply if isinstance(layer, Sequential) else reported(apply, path)


# -- containers --------------------------------------------------------------------------


@builds(Sequential)
def _sequential(layer: Sequential, path: str) -> Apply:
    return chained([build(child, key(path, name)) for name, child in layer.layers])


def chained(steps: list[Apply]) -> Apply:
    """Each step applied to the previous one's output (a Sequential's function)."""

    def apply(state: State, x: Array, ctx: Context) -> Array:
        for step in steps:
            x = step(state, x, ctx)
        return x

    return apply


@builds(Residual)
def _residual(layer: Residual, path: str) -> Apply:
    body = build(layer.body, key(path, "body"))
    shortcut = build(layer.shortcut, key(path, "shortcut")) if layer.shortcut else None
    return residual(body, shortcut)


def residual(body: Apply, shortcut: Apply | None) -> Apply:
    """``relu(body(x) + shortcut(x))``, the identity without a shortcut (Residual's)."""

    def apply(state: State, x: Array, ctx: Context) -> Array:
        y = body(state, x, ctx)
        return jax.nn.relu(y + (shortcut(state, x, ctx) if shortcut else x))

    return apply


@builds(Add)
def _add(layer: Add, path: str) -> Apply:
    branches = [build(b, key(path, f"branches.{i}")) for i, b in enumerate(layer.branches)]
    return summed(branches)


def summed(branches: list[Apply]) -> Apply:
    """The sum of every branch applied to the same input (Add's function)."""

    def apply(state: State, x: Array, ctx: Context) -> Array:
        outs = [branch(state, x, ctx) for branch in branches]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total

    return apply


# -- image layers ------------------------------------------------------------------------


def conv(x: Array, w: Array, b: Array | None, stride: int, padding: int, dims: str) -> Array:
    """Cross-correlation in NCHW/OIHW (``dims="HW"``) or NCL/OIL (``"L"``)."""
    spatial = len(dims)
    names = ("NC" + dims, "OI" + dims, "NC" + dims)
    y = lax.conv_general_dilated(
        x, w, (stride,) * spatial, [(padding, padding)] * spatial, dimension_numbers=names,
        precision=lax.Precision.HIGHEST,
    )  # fmt: skip
    return y if b is None else y + b.reshape((1, -1) + (1,) * spatial)


@builds(Conv2d)
def _conv2d(layer: Conv2d, path: str) -> Apply:
    w, b = key(path, "weight"), key(path, "bias") if layer.bias else None

    def apply(state: State, x: Array, ctx: Context) -> Array:
        return conv(x, state[w], state[b] if b else None, layer.stride, layer.padding, "HW")

    return apply


def linear(x: Array, w: Array, b: Array | None) -> Array:
    y = jnp.matmul(x, w.T, precision=lax.Precision.HIGHEST)
    return y if b is None else y + b


@builds(Linear)
def _linear(layer: Linear, path: str) -> Apply:
    w, b = key(path, "weight"), key(path, "bias") if layer.bias else None
    return lambda state, x, ctx: linear(x, state[w], state[b] if b else None)


def batch_norm(
    layer: Any, path: str, state: State, x: Array, ctx: Context, axes: tuple[int, ...],
    channel: int = 1,
) -> Array:  # fmt: skip
    """BatchNorm over ``axes`` (all but the ``channel`` axis): batch statistics in training
    (the running ones updated into ``ctx.updates`` with PyTorch's momentum and unbiased
    variance), the running ones in eval mode."""
    shape = tuple(-1 if a == channel else 1 for a in range(x.ndim))
    names = [key(path, n) for n in ("weight", "bias", "running_mean", "running_var")]
    w, b, rm, rv = (state[n].reshape(shape) for n in names)
    if not ctx.train:
        return (x - rm) / jnp.sqrt(rv + layer.eps) * w + b
    n = int(np.prod([x.shape[a] for a in axes]))
    if n < 2:
        raise BackendError(
            f"{type(layer).__name__} in training needs more than one value per channel, got "
            f"input {tuple(x.shape)}: use a larger batch (or train=False)."
        )
    mean = x.mean(axis=axes, keepdims=True)
    centred = x - mean
    var = jnp.square(centred).mean(axis=axes, keepdims=True)
    y = centred / jnp.sqrt(var + layer.eps) * w + b
    m = layer.momentum
    batch_mean, batch_var = lax.stop_gradient(mean.reshape(-1)), lax.stop_gradient(var.reshape(-1))
    ctx.updates[names[2]] = state[names[2]] * (1 - m) + m * batch_mean
    ctx.updates[names[3]] = state[names[3]] * (1 - m) + m * batch_var * (n / (n - 1))
    return y


@builds(BatchNorm2d)
def _batch_norm2d(layer: BatchNorm2d, path: str) -> Apply:
    return lambda state, x, ctx: batch_norm(layer, path, state, x, ctx, (0, 2, 3))


@builds(ReLU)
def _relu(layer: ReLU, path: str) -> Apply:
    return lambda state, x, ctx: jax.nn.relu(x)


#: the spatial axes of a 4-d batch: (H, W) of NCHW
NCHW_SPATIAL = (2, 3)


def _window(size: int, spatial: tuple[int, int]) -> tuple[int, ...]:
    return tuple(size if axis in spatial else 1 for axis in range(4))


def max_pool(layer: MaxPool2d, x: Array, spatial: tuple[int, int] = NCHW_SPATIAL) -> Array:
    """MaxPool2d over the ``spatial`` axes of ``x``."""
    k, s, p = layer.kernel_size, layer.stride or layer.kernel_size, layer.padding
    pads = tuple((p, p) if axis in spatial else (0, 0) for axis in range(4))
    return lax.reduce_window(x, -jnp.inf, lax.max, _window(k, spatial), _window(s, spatial), pads)


@builds(MaxPool2d)
def _max_pool(layer: MaxPool2d, path: str) -> Apply:
    return lambda state, x, ctx: max_pool(layer, x)


def pool_divisor(size: int, k: int, s: int, pad: int, ceil: bool, include_pad: bool) -> np.ndarray:
    """Per output position along one axis, the count PyTorch's average divides by."""
    out = pool_output_size(size, k, s, pad, ceil)
    counts = []
    for i in range(out):
        lo = i * s - pad
        hi = min(lo + k, size + pad)
        counts.append(hi - lo if include_pad else min(hi, size) - max(lo, 0))
    return np.asarray(counts, dtype=np.float64)


def avg_pool(layer: AvgPool2d, x: Array, spatial: tuple[int, int] = NCHW_SPATIAL) -> Array:
    """AvgPool2d over the ``spatial`` axes of ``x`` (PyTorch's divisor, ceil mode)."""
    k, s, p = layer.kernel_size, layer.stride or layer.kernel_size, layer.padding
    pads = [(0, 0)] * 4
    divisors = []
    for axis in spatial:
        size = x.shape[axis]
        out = pool_output_size(size, k, s, p, layer.ceil_mode)
        pads[axis] = (p, p + max((out - 1) * s + k - size - 2 * p, 0))
        divisors.append(pool_divisor(size, k, s, p, layer.ceil_mode, layer.count_include_pad))
    total = lax.reduce_window(x, 0.0, lax.add, _window(k, spatial), _window(s, spatial), pads)
    divisor = np.outer(*divisors)
    divisor = divisor.reshape(divisor.shape + (1,) * (3 - spatial[1]))  # axes after W
    return total / divisor.astype(x.dtype)


@builds(AvgPool2d)
def _avg_pool(layer: AvgPool2d, path: str) -> Apply:
    return lambda state, x, ctx: avg_pool(layer, x)


@builds(GlobalAvgPool2d)
def _global_avg_pool(layer: GlobalAvgPool2d, path: str) -> Apply:
    return lambda state, x, ctx: x.mean(axis=(2, 3), keepdims=True)


@builds(Flatten)
def _flatten(layer: Flatten, path: str) -> Apply:
    return lambda state, x, ctx: x.reshape(x.shape[0], -1)


@builds(Dropout)
def _dropout(layer: Dropout, path: str) -> Apply:
    def apply(state: State, x: Array, ctx: Context) -> Array:
        if not ctx.train or layer.p == 0:
            return x
        return x * ctx.dropout_mask(tuple(x.shape), layer.p, x.dtype)

    return apply
