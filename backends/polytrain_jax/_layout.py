"""Channels-last convolution runs on a CPU (float32).

XLA's CPU convolutions work in NHWC order: a network traced in NCHW order gets transposes
around every convolution and its gradients, and its pools walk strided windows. So on a
CPU in float32 the backend computes each run of consecutive layers that have an NHWC form
(convolutions, BatchNorm, ReLU, pools, residual blocks made of them) in NHWC: the batch is
transposed once into the run and once out of it, the weights stay in their canonical
OIHW order in the state (transposed inside the compiled program, where XLA folds it), and
every output the layer hook sees is NCHW. LeNet's step measured 10-25 % faster on the
project's 2-vCPU CPU (docs/performance.md, "Channels-last convolutions on a CPU (jax)");
float64 was not faster, so it keeps NCHW, and so do other devices (not measured). Only
the summation order inside a convolution can differ (float32 rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import lax

from polytrain.neutral.models import (
    Add,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    GlobalAvgPool2d,
    Layer,
    MaxPool2d,
    ReLU,
    Residual,
    Sequential,
)

from ._net import (
    Apply,
    Array,
    Context,
    State,
    avg_pool,
    batch_norm,
    build,
    builder_for,
    chained,
    key,
    max_pool,
    registrar,
    reported,
    residual,
    summed,
)

#: NHWC builders: (layer, path) -> an NHWC -> NHWC function, or None (no NHWC form)
NhwcBuilder = Callable[[Any, str], Apply | None]
NHWC_BUILDERS: dict[type, NhwcBuilder] = {}
nhwc_builds = registrar(NHWC_BUILDERS)
NHWC_SPATIAL = (1, 2)  # H, W of an NHWC batch


def wants_channels_last(dtype: str, platforms: list[str]) -> bool:
    """Whether a model of ``dtype`` on devices of ``platforms`` computes convolution runs
    channels-last: where it was measured faster (float32 on CPUs)."""
    return dtype == "float32" and all(p == "cpu" for p in platforms)


def to_nhwc(x: Array) -> Array:
    return x.transpose(0, 2, 3, 1)


def to_nchw(x: Array) -> Array:
    return x.transpose(0, 3, 1, 2)


def build_fast_layout(layer: Layer, path: str = "") -> Apply:
    """``layer``'s NCHW -> NCHW function, every run of NHWC-capable layers that holds a
    convolution computed channels-last inside it."""
    if has_conv(layer):
        nhwc = build_nhwc(layer, path)
        if nhwc is not None:
            return _bracketed(nhwc)
    if isinstance(layer, Sequential):
        return _sequential_runs(layer, path)
    return build(layer, path)


def _bracketed(nhwc: Apply) -> Apply:
    return lambda state, x, ctx: to_nchw(nhwc(state, to_nhwc(x), ctx))


def _sequential_runs(layer: Sequential, path: str) -> Apply:
    """A Sequential split into maximal runs of layers with an NHWC form; the runs that
    hold a convolution compute channels-last, everything else as :func:`build` makes it."""
    parts: list[Apply] = []
    run: list[tuple[Layer, str, Apply]] = []  # (layer, path, its NHWC function)

    def close_run() -> None:
        if any(has_conv(child) for child, _, _ in run):
            parts.append(_bracketed(chained([nhwc for _, _, nhwc in run])))
        else:
            parts.extend(build(child, child_path) for child, child_path, _ in run)
        run.clear()

    for name, child in layer.layers:
        child_path = key(path, name)
        nhwc = build_nhwc(child, child_path)
        if nhwc is None:
            close_run()
            parts.append(build_fast_layout(child, child_path))
        else:
            run.append((child, child_path, nhwc))
    close_run()
    return chained(parts)


def has_conv(layer: Layer) -> bool:
    if isinstance(layer, Conv2d):
        return True
    if isinstance(layer, Sequential):
        return any(has_conv(child) for _, child in layer.layers)
    if isinstance(layer, Residual):
        return has_conv(layer.body) or (layer.shortcut is not None and has_conv(layer.shortcut))
    if isinstance(layer, Add):
        return any(has_conv(b) for b in layer.branches)
    return False


def build_nhwc(layer: Layer, path: str) -> Apply | None:
    """``layer``'s NHWC -> NHWC function (its output reported NCHW to the hook), or None
    when it or a layer inside it has no NHWC form."""
    builder = builder_for(NHWC_BUILDERS, layer)
    apply = builder(layer, path) if builder is not None else None
    if apply is None or isinstance(layer, Sequential):
        return apply
    return reported(apply, path, to_nchw)


# -- containers --------------------------------------------------------------------------


@nhwc_builds(Sequential)
def _sequential(layer: Sequential, path: str) -> Apply | None:
    children = [build_nhwc(child, key(path, name)) for name, child in layer.layers]
    if any(c is None for c in children):
        return None
    return chained([c for c in children if c is not None])


@nhwc_builds(Residual)
def _residual(layer: Residual, path: str) -> Apply | None:
    body = build_nhwc(layer.body, key(path, "body"))
    shortcut = build_nhwc(layer.shortcut, key(path, "shortcut")) if layer.shortcut else None
    if body is None or (layer.shortcut is not None and shortcut is None):
        return None
    return residual(body, shortcut)


@nhwc_builds(Add)
def _add(layer: Add, path: str) -> Apply | None:
    branches = [build_nhwc(b, key(path, f"branches.{i}")) for i, b in enumerate(layer.branches)]
    ready = [b for b in branches if b is not None]
    return summed(ready) if len(ready) == len(branches) else None


# -- image layers ------------------------------------------------------------------------


@nhwc_builds(Conv2d)
def _conv2d(layer: Conv2d, path: str) -> Apply:
    w, b = key(path, "weight"), key(path, "bias") if layer.bias else None
    stride, pad = (layer.stride,) * 2, [(layer.padding, layer.padding)] * 2

    def apply(state: State, x: Array, ctx: Context) -> Array:
        y = lax.conv_general_dilated(
            x, state[w].transpose(2, 3, 1, 0), stride, pad,
            dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=lax.Precision.HIGHEST,
        )  # fmt: skip
        return y if b is None else y + state[b]

    return apply


@nhwc_builds(BatchNorm2d)
def _batch_norm2d(layer: BatchNorm2d, path: str) -> Apply:
    return lambda state, x, ctx: batch_norm(layer, path, state, x, ctx, (0, 1, 2), channel=3)


@nhwc_builds(ReLU)
def _relu(layer: ReLU, path: str) -> Apply:
    return lambda state, x, ctx: jax.nn.relu(x)


@nhwc_builds(MaxPool2d)
def _max_pool(layer: MaxPool2d, path: str) -> Apply:
    return lambda state, x, ctx: max_pool(layer, x, NHWC_SPATIAL)


@nhwc_builds(AvgPool2d)
def _avg_pool(layer: AvgPool2d, path: str) -> Apply:
    return lambda state, x, ctx: avg_pool(layer, x, NHWC_SPATIAL)


@nhwc_builds(GlobalAvgPool2d)
def _global_avg_pool(layer: GlobalAvgPool2d, path: str) -> Apply:
    return lambda state, x, ctx: x.mean(axis=(1, 2), keepdims=True)
