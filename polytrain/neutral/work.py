"""How much arithmetic a model does per sample, from its spec alone (no weights, no run):
the automatic compile mode scales a step time measured on LeNet by it.

Counted: the multiply-adds of convolutions and dense layers in the forward pass, which are
nearly all of a convolutional network's work; element-wise layers, pooling and BatchNorm
are free here. Layers whose work this does not model (sequence layers, attention) give
``None``: the caller must not guess.
"""

from __future__ import annotations

from polytrain.neutral.models import (
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    Linear,
    MaxPool2d,
    ModelSpec,
    ReLU,
    Residual,
    Sequential,
)

Shape = tuple[int, ...]
FREE = (ReLU, Dropout, BatchNorm1d, BatchNorm2d)


class _Unmodelled(Exception):
    pass


def forward_multiply_adds(spec: ModelSpec) -> int | None:
    """Multiply-adds of one sample's forward pass, or None when a layer's work is not
    modelled (or the spec's shapes do not fit, which the run itself will report)."""
    try:
        macs, _ = _layer(spec.net, tuple(spec.input_shape))
    except (_Unmodelled, ValueError, ZeroDivisionError):
        return None
    return macs


def layer_count(spec: ModelSpec) -> int:
    """Leaf layers of the spec (a compiled graph grows with them)."""
    return sum(1 for _ in _leaves(spec.net))


def _leaves(layer: Layer) -> list[Layer]:
    if isinstance(layer, Sequential):
        return [leaf for _, child in layer.layers for leaf in _leaves(child)]
    if isinstance(layer, Residual):
        shortcut = _leaves(layer.shortcut) if layer.shortcut is not None else []
        return [*_leaves(layer.body), *shortcut]
    return [layer]


def _pooled(size: int, kernel: int, stride: int, padding: int, ceil: bool = False) -> int:
    span = size + 2 * padding - kernel
    steps = -(-span // stride) if ceil else span // stride
    if steps < 0:
        raise ValueError("window larger than the input")
    return steps + 1


def _layer(layer: Layer, shape: Shape) -> tuple[int, Shape]:
    if isinstance(layer, Sequential):
        total = 0
        for _, child in layer.layers:
            macs, shape = _layer(child, shape)
            total += macs
        return total, shape
    if isinstance(layer, Residual):
        body, out = _layer(layer.body, shape)
        short = _layer(layer.shortcut, shape)[0] if layer.shortcut is not None else 0
        return body + short, out
    if isinstance(layer, FREE):
        return 0, shape
    if isinstance(layer, Flatten):
        size = 1
        for d in shape:
            size *= d
        return 0, (size,)
    if isinstance(layer, Linear):
        rows = 1
        for d in shape[:-1]:
            rows *= d
        return rows * layer.in_features * layer.out_features, (*shape[:-1], layer.out_features)
    if len(shape) != 3:
        raise _Unmodelled(type(layer).__name__)
    c, h, w = shape
    if isinstance(layer, Conv2d):
        k, s, p = layer.kernel_size, layer.stride, layer.padding
        oh, ow = _pooled(h, k, s, p), _pooled(w, k, s, p)
        return layer.out_channels * oh * ow * layer.in_channels * k * k, (
            layer.out_channels,
            oh,
            ow,
        )
    if isinstance(layer, (MaxPool2d, AvgPool2d)):
        k, p = layer.kernel_size, layer.padding
        s = layer.stride or k
        ceil = isinstance(layer, AvgPool2d) and layer.ceil_mode
        return 0, (c, _pooled(h, k, s, p, ceil), _pooled(w, k, s, p, ceil))
    if isinstance(layer, GlobalAvgPool2d):
        return 0, (c,)
    raise _Unmodelled(type(layer).__name__)
