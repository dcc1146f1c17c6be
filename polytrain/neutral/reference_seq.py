"""Numpy reference of the sequence and transformer layers (forward and backward).

Float64 in the reference; dtype-generic, so the numpy backend runs the very same
functions (its exact twin). ``run``/``back`` recurse into branches (of :class:`Add`) with
the caller's own forward/backward, so train/eval handling stays in one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from polytrain.neutral.models import (
    GELU,
    Add,
    BatchNorm1d,
    Conv1d,
    Embedding,
    Layer,
    LayerNorm,
    LogSoftmax,
    Mean,
    PositionalEmbedding,
    Reshape,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
    Transpose,
)

Params = dict[str, np.ndarray]
Run = Callable[[Layer, str, np.ndarray], np.ndarray]
Back = Callable[[Layer, str, np.ndarray, np.ndarray], np.ndarray]
GELU_TANH_C = math.sqrt(2.0 / math.pi)
_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function element-wise (libm's ``erf`` in float64; numpy has none)."""
    return np.asarray(_erf(x.astype(np.float64)), dtype=np.float64).astype(x.dtype, copy=False)


def _key(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# -- element-wise and along-an-axis activations --------------------------------------------


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(GELU_TANH_C * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_backward(x: np.ndarray, g: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        t = np.tanh(GELU_TANH_C * (x + 0.044715 * x**3))
        du = GELU_TANH_C * (1.0 + 3 * 0.044715 * x**2)
        return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
    cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return g * (cdf + x * pdf)


def softmax(x: np.ndarray, dim: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def log_softmax(x: np.ndarray, dim: int) -> np.ndarray:
    z = x - x.max(axis=dim, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=dim, keepdims=True))


def activation(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Forward of GELU, SiLU, Tanh, Sigmoid, Softmax, LogSoftmax."""
    if isinstance(layer, GELU):
        return gelu(x, layer.approximate)
    if isinstance(layer, SiLU):
        return x * sigmoid(x)
    if isinstance(layer, Tanh):
        return np.tanh(x)
    if isinstance(layer, Sigmoid):
        return sigmoid(x)
    if isinstance(layer, Softmax):
        return softmax(x, layer.dim)
    if isinstance(layer, LogSoftmax):
        return log_softmax(x, layer.dim)
    raise TypeError(f"not an activation: {layer!r}")


def activation_backward(layer: Layer, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    if isinstance(layer, GELU):
        return gelu_backward(x, g, layer.approximate)
    if isinstance(layer, SiLU):
        s = sigmoid(x)
        return g * s * (1.0 + x * (1.0 - s))
    if isinstance(layer, Tanh):
        return g * (1.0 - np.tanh(x) ** 2)
    if isinstance(layer, Sigmoid):
        s = sigmoid(x)
        return g * s * (1.0 - s)
    if isinstance(layer, Softmax):
        y = softmax(x, layer.dim)
        return y * (g - (g * y).sum(axis=layer.dim, keepdims=True))
    if isinstance(layer, LogSoftmax):
        return g - softmax(x, layer.dim) * g.sum(axis=layer.dim, keepdims=True)
    raise TypeError(f"not an activation: {layer!r}")


ACTIVATIONS = (GELU, SiLU, Tanh, Sigmoid, Softmax, LogSoftmax)


# -- Conv1d --------------------------------------------------------------------------------


def conv1d(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, padding: int
) -> np.ndarray:
    """Cross-correlation, [N, C, L] input, [O, C, K] weight."""
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
    out_len = (x.shape[2] + 2 * padding - k) // stride + 1
    y = sum(
        np.einsum("ncl,oc->nol", xp[:, :, i : i + stride * out_len : stride], w[:, :, i])
        for i in range(k)
    )
    y = np.asarray(y, dtype=x.dtype)
    return y + b[None, :, None] if b is not None else y


def conv1d_backward(
    x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: int, padding: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`conv1d` w.r.t. input, weight, bias."""
    k, out_len = w.shape[2], g.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
    gxp, gw = np.zeros_like(xp), np.zeros_like(w)
    for i in range(k):
        window = slice(i, i + stride * out_len, stride)
        gw[:, :, i] = np.einsum("nol,ncl->oc", g, xp[:, :, window])
        gxp[:, :, window] += np.einsum("nol,oc->ncl", g, w[:, :, i])
    return gxp[:, :, padding : padding + x.shape[2]], gw, g.sum(axis=(0, 2))


# -- normalisation -------------------------------------------------------------------------


def channel_axes(x: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """BatchNorm1d's reduction axes (all but C) and the shape that broadcasts [C] to x."""
    return (0, *range(2, x.ndim)), (1, -1) + (1,) * (x.ndim - 2)


def normalise(x: np.ndarray, axes: tuple[int, ...], eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance), and 1/sqrt(var + eps)."""
    mean = x.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return (x - mean) * inv_std, inv_std


def normalise_backward(
    xhat: np.ndarray, inv_std: np.ndarray, gxhat: np.ndarray, axes: tuple[int, ...]
) -> np.ndarray:
    mean_g = gxhat.mean(axis=axes, keepdims=True)
    mean_gx = (gxhat * xhat).mean(axis=axes, keepdims=True)
    return inv_std * (gxhat - mean_g - xhat * mean_gx)


def layer_norm_axes(layer: LayerNorm, x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(layer.normalized_shape), x.ndim))


# -- axes: Transpose and Mean -------------------------------------------------------------


def sample_axis(dim: int, x: np.ndarray, what: str) -> int:
    """``dim`` as a non-negative axis of ``x``; the batch axis 0 or one beyond ``x``'s
    dims is refused (the spec cannot know the shape it will meet)."""
    axis = dim + x.ndim if dim < 0 else dim
    if not 1 <= axis < x.ndim:
        raise ValueError(f"{what}: axis {dim} is not a sample axis of an input of shape {x.shape}")
    return axis


def transpose_axes(layer: Transpose, x: np.ndarray) -> list[int]:
    """The permutation of ``x``'s axes that swaps ``dim0`` and ``dim1`` (its own inverse)."""
    what = f"Transpose({layer.dim0}, {layer.dim1})"
    a, b = sample_axis(layer.dim0, x, what), sample_axis(layer.dim1, x, what)
    axes = list(range(x.ndim))
    axes[a], axes[b] = b, a
    return axes


def mean_backward(layer: Mean, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Each input element gets ``g / size`` of its axis."""
    axis = sample_axis(layer.dim, x, f"Mean({layer.dim})")
    return np.broadcast_to(np.expand_dims(g, axis) / x.shape[axis], x.shape).copy()


# -- the layers ----------------------------------------------------------------------------


def forward(layer: Layer, path: str, p: Params, x: np.ndarray, train: bool, run: Run) -> np.ndarray:
    """Forward of one sequence/transformer layer; ``train``: BatchNorm1d's batch statistics."""
    key = lambda name: _key(path, name)  # noqa: E731
    if isinstance(layer, Add):
        outs = [run(b, key(f"branches.{i}"), x) for i, b in enumerate(layer.branches)]
        return sum(outs[1:], outs[0])
    if isinstance(layer, ACTIVATIONS):
        return activation(layer, x)
    if isinstance(layer, Reshape):
        return x.reshape(x.shape[0], *layer.shape)
    if isinstance(layer, Transpose):
        return np.ascontiguousarray(x.transpose(transpose_axes(layer, x)))
    if isinstance(layer, Mean):
        return x.mean(axis=sample_axis(layer.dim, x, f"Mean({layer.dim})"))
    if isinstance(layer, Conv1d):
        return conv1d(x, p[key("weight")], p.get(key("bias")), layer.stride, layer.padding)
    if isinstance(layer, BatchNorm1d):
        axes, shape = channel_axes(x)
        if train:
            xhat, _ = normalise(x, axes, layer.eps)
        else:
            mean, var = p[key("running_mean")].reshape(shape), p[key("running_var")].reshape(shape)
            xhat = (x - mean) / np.sqrt(var + layer.eps)
        return xhat * p[key("weight")].reshape(shape) + p[key("bias")].reshape(shape)
    if isinstance(layer, LayerNorm):
        xhat, _ = normalise(x, layer_norm_axes(layer, x), layer.eps)
        if not layer.elementwise_affine:
            return xhat
        return xhat * p[key("weight")] + p[key("bias")]
    if isinstance(layer, Embedding):
        return p[key("weight")][np.asarray(x).astype(np.int64)]
    if isinstance(layer, PositionalEmbedding):
        if x.ndim != 3 or x.shape[1] > layer.max_len:
            raise ValueError(
                f"PositionalEmbedding({layer.max_len}) needs [N, T<=max_len, E], got {x.shape}"
            )
        return x + p[key("weight")][: x.shape[1]]
    raise TypeError(f"no reference for {layer!r}")


def backward(
    layer: Layer, path: str, p: Params, x: np.ndarray, g: np.ndarray, train: bool,
    grads: Params, back: Back,
) -> np.ndarray:  # fmt: skip
    """Gradient w.r.t. ``x`` given ``g``; parameter gradients go to ``grads``."""
    key = lambda name: _key(path, name)  # noqa: E731
    if isinstance(layer, Add):
        parts = [back(b, key(f"branches.{i}"), x, g) for i, b in enumerate(layer.branches)]
        return sum(parts[1:], parts[0])
    if isinstance(layer, ACTIVATIONS):
        return activation_backward(layer, x, g)
    if isinstance(layer, Reshape):
        return g.reshape(x.shape)
    if isinstance(layer, Transpose):
        return np.ascontiguousarray(g.transpose(transpose_axes(layer, x)))
    if isinstance(layer, Mean):
        return mean_backward(layer, x, g)
    if isinstance(layer, Conv1d):
        gx, gw, gb = conv1d_backward(x, p[key("weight")], g, layer.stride, layer.padding)
        grads[key("weight")] = gw
        if layer.bias:
            grads[key("bias")] = gb
        return gx
    if isinstance(layer, BatchNorm1d):
        axes, shape = channel_axes(x)
        w = p[key("weight")].reshape(shape)
        if train:
            xhat, inv_std = normalise(x, axes, layer.eps)
        else:
            inv_std = 1.0 / np.sqrt(p[key("running_var")].reshape(shape) + layer.eps)
            xhat = (x - p[key("running_mean")].reshape(shape)) * inv_std
        grads[key("weight")] = (g * xhat).sum(axis=axes)
        grads[key("bias")] = g.sum(axis=axes)
        return normalise_backward(xhat, inv_std, g * w, axes) if train else g * w * inv_std
    if isinstance(layer, LayerNorm):
        axes = layer_norm_axes(layer, x)
        xhat, inv_std = normalise(x, axes, layer.eps)
        gxhat = g
        if layer.elementwise_affine:
            lead = tuple(range(x.ndim - len(axes)))
            grads[key("weight")] = (g * xhat).sum(axis=lead)
            grads[key("bias")] = g.sum(axis=lead)
            gxhat = g * p[key("weight")]
        return normalise_backward(xhat, inv_std, gxhat, axes)
    if isinstance(layer, Embedding):
        gw = np.zeros_like(p[key("weight")])
        np.add.at(gw, np.asarray(x).astype(np.int64), g)
        grads[key("weight")] = gw
        return np.zeros(np.shape(x), dtype=g.dtype)
    if isinstance(layer, PositionalEmbedding):
        gw = np.zeros_like(p[key("weight")])
        gw[: x.shape[1]] = g.sum(axis=0)
        grads[key("weight")] = gw
        return g
    raise TypeError(f"no reference backward for {layer!r}")
