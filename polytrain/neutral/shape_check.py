"""Which layer an input does not fit, for a one-line error instead of a framework's.

Only called after a backend failed on a batch: the numpy reference runs one sample of the
batch's shape through the spec (zero weights, float64) and reports the first layer that
cannot take what it is given, with the shapes, or the mismatch with the spec's
``input_shape`` when the spec itself is consistent.
"""

from __future__ import annotations

import functools

import numpy as np

from polytrain.neutral import reference
from polytrain.neutral.models import (
    Add,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    Embedding,
    Layer,
    Linear,
    ModelSpec,
    Residual,
    Sequential,
)


class _Misfit(Exception):
    def __init__(self, path: str, layer: Layer, shape: tuple[int, ...], why: str) -> None:
        super().__init__(path)
        self.path, self.layer, self.shape, self.why = path, layer, shape, why


def _walk(layer: Layer, path: str, p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    def key(name: str) -> str:
        return f"{path}.{name}" if path else name

    if isinstance(layer, Sequential):
        for name, child in layer.layers:
            x = _walk(child, key(name), p, x)
        return x
    if isinstance(layer, Residual):
        y = _walk(layer.body, key("body"), p, x)
        s = x if layer.shortcut is None else _walk(layer.shortcut, key("shortcut"), p, x)
        if y.shape != s.shape:
            raise _Misfit(path, layer, x.shape, f"body gives {_dims(y.shape)}, shortcut "
                          f"{_dims(s.shape)}")  # fmt: skip
        return np.maximum(y + s, 0.0)
    if isinstance(layer, Add):
        outs = [_walk(b, key(f"branches.{i}"), p, x) for i, b in enumerate(layer.branches)]
        if len({o.shape for o in outs}) > 1:
            shapes = ", ".join(_dims(o.shape) for o in outs)
            raise _Misfit(path, layer, x.shape, f"its branches give {shapes}")
        return np.sum(outs, axis=0)
    why = _expectation(layer, x.shape)
    if why:
        raise _Misfit(path, layer, x.shape, why)
    try:
        return reference._run(layer, path, p, x)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise _Misfit(path, layer, x.shape, str(exc).splitlines()[0] if str(exc) else "") from None


def _expectation(layer: Layer, shape: tuple[int, ...]) -> str:
    """What ``layer`` needs that ``shape`` lacks ('' if nothing is seen; numpy broadcasting
    would otherwise hide a channel count of 1 against any other)."""
    if isinstance(layer, Conv2d | BatchNorm2d):
        channels = layer.in_channels if isinstance(layer, Conv2d) else layer.num_features
        if len(shape) != 4 or shape[1] != channels:
            return f"it takes [N, {channels}, H, W]"
    if isinstance(layer, Conv1d) and (len(shape) != 3 or shape[1] != layer.in_channels):
        return f"it takes [N, {layer.in_channels}, L]"
    if isinstance(layer, BatchNorm1d) and (
        len(shape) not in (2, 3) or shape[1] != layer.num_features
    ):
        return f"it takes [N, {layer.num_features}] or [N, {layer.num_features}, L]"
    if isinstance(layer, Linear) and shape[-1] != layer.in_features:
        return f"it takes [..., {layer.in_features}]"
    return ""


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _first_layer(layer: Layer) -> Layer:
    while isinstance(layer, Sequential) and layer.layers:
        layer = layer.layers[0][1]
    return layer


def describe_misfit(spec: ModelSpec, batch_shape: tuple[int, ...]) -> str | None:
    """Why a batch of ``batch_shape`` does not fit ``spec`` (None: the numpy reference takes
    it, so the failure was something else)."""
    sample = tuple(batch_shape[1:])
    ids = isinstance(_first_layer(spec.net), Embedding)
    x = np.zeros((1, *sample), dtype=np.int64 if ids else np.float64)
    params = {k: np.zeros(s) for k, s in spec.parameter_shapes().items()}
    for name in params:
        if name.endswith(".running_var"):
            params[name] += 1.0
    try:
        with np.errstate(all="ignore"):
            _walk(spec.net, "", params, x)
    except _Misfit as misfit:
        where = f"layer {misfit.path!r}" if misfit.path else "the model"
        expected = ""
        if sample != tuple(spec.input_shape):
            expected = f" (the spec {spec.name!r} takes samples of {_dims(spec.input_shape)})"
        return (
            f"Input of shape {_dims(batch_shape)} does not fit {spec.name!r}{expected}: "
            f"{where} ({type(misfit.layer).__name__}) gets {_dims(misfit.shape)} for a "
            f"batch of 1{': ' + misfit.why if misfit.why else ''}."
        )
    return None


@functools.lru_cache(maxsize=8)
def sample_output_shape(spec: ModelSpec) -> tuple[int, ...] | None:
    """The shape of the model's output for one sample (``(classes,)``, or ``(T, classes)``
    for a sequence model), from one zero sample through the numpy reference with zero
    weights (read-only broadcast views: nothing the size of the model is allocated); None
    when the reference cannot run it (the first step then names the misfit)."""
    ids = isinstance(_first_layer(spec.net), Embedding)
    x = np.zeros((1, *spec.input_shape), dtype=np.int64 if ids else np.float64)
    params = {
        name: np.broadcast_to(np.float64(1.0 if name.endswith(".running_var") else 0.0), shape)
        for name, shape in spec.parameter_shapes().items()
    }
    try:
        with np.errstate(all="ignore"):
            out = reference.forward(spec, params, x)
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    return tuple(int(n) for n in out.shape[1:])
