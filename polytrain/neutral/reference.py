"""Numpy reference of the neutral specs: the yardstick of the conformance suite.

Float64, written for clarity, not speed. Forward of every layer type; cross-entropy;
and exact gradients for specs made of Flatten/Linear/ReLU (the ``mlp`` spec).
"""

from __future__ import annotations

import math

import numpy as np

from polytrain.neutral import reference_attention, reference_rnn, reference_seq
from polytrain.neutral.models import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    Linear,
    MaxPool2d,
    ModelSpec,
    MultiHeadSelfAttention,
    RecurrentLayer,
    ReLU,
    Residual,
    SequenceLayer,
    Sequential,
)


def forward(spec: ModelSpec, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Eval-mode logits of ``spec`` with canonical ``params`` for input ``x`` (NCHW)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    return _run(spec.net, "", p, x.astype(np.float64))


def _run(layer: Layer, path: str, p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:  # noqa: C901 - one branch per layer kind
    def key(name: str) -> str:
        return f"{path}.{name}" if path else name

    if isinstance(layer, Sequential):
        for name, child in layer.layers:
            x = _run(child, key(name), p, x)
        return x
    if isinstance(layer, Residual):
        y = _run(layer.body, key("body"), p, x)
        s = x if layer.shortcut is None else _run(layer.shortcut, key("shortcut"), p, x)
        return np.maximum(y + s, 0.0)
    if isinstance(layer, Conv2d):
        b = p.get(key("bias"))
        return conv2d(x, p[key("weight")], b, layer.stride, layer.padding)
    if isinstance(layer, Linear):
        y = x @ p[key("weight")].T
        return y + p[key("bias")] if layer.bias else y
    if isinstance(layer, BatchNorm2d):
        mean = p[key("running_mean")][None, :, None, None]
        var = p[key("running_var")][None, :, None, None]
        w = p[key("weight")][None, :, None, None]
        b = p[key("bias")][None, :, None, None]
        return (x - mean) / np.sqrt(var + layer.eps) * w + b
    if isinstance(layer, ReLU):
        return np.maximum(x, 0.0)
    if isinstance(layer, MaxPool2d):
        return pool2d(x, layer.kernel_size, layer.stride or layer.kernel_size, layer.padding, "max")
    if isinstance(layer, AvgPool2d):
        return pool2d(
            x,
            layer.kernel_size,
            layer.stride or layer.kernel_size,
            layer.padding,
            "avg",
            ceil_mode=layer.ceil_mode,
            count_include_pad=layer.count_include_pad,
        )
    if isinstance(layer, GlobalAvgPool2d):
        return x.mean(axis=(2, 3), keepdims=True)
    if isinstance(layer, Flatten):
        return x.reshape(x.shape[0], -1)
    if isinstance(layer, Dropout):
        return x
    if isinstance(layer, MultiHeadSelfAttention):
        weights = reference_attention.leaves(layer, p, path)
        return reference_attention.self_attention(layer, weights, x)[0]
    if isinstance(layer, RecurrentLayer):
        return reference_rnn.recurrent(layer, reference_rnn.leaves(layer, p, path), x)[0]
    if isinstance(layer, SequenceLayer):
        return reference_seq.forward(layer, path, p, x, False, lambda c, k, h: _run(c, k, p, h))
    raise TypeError(f"no reference for {layer!r}")


def conv2d(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int = 1, padding: int = 0
) -> np.ndarray:
    """Cross-correlation, NCHW input, OIHW weight."""
    n, c, h, wd = x.shape
    _, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (wd + 2 * padding - kw) // stride + 1
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
    y = np.einsum("nchwij,ochw->noij", cols, w, optimize=True)
    return y + b[None, :, None, None] if b is not None else y


def pool_output_size(size: int, k: int, s: int, pad: int, ceil_mode: bool) -> int:
    """PyTorch's rule: with ceil_mode the last window must start inside the input or
    left padding (so ceil_mode with padding can be one smaller than Paddle/MXNet)."""
    if not ceil_mode:
        return (size + 2 * pad - k) // s + 1
    out = math.ceil((size + 2 * pad - k) / s) + 1
    if (out - 1) * s >= size + pad:
        out -= 1
    return out


def pool2d(
    x: np.ndarray,
    k: int,
    s: int,
    pad: int,
    mode: str,
    *,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> np.ndarray:
    """Max or average pooling with PyTorch's semantics."""
    n, c, h, w = x.shape
    oh = pool_output_size(h, k, s, pad, ceil_mode)
    ow = pool_output_size(w, k, s, pad, ceil_mode)
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s - pad, j * s - pad
            h1, w1 = min(h0 + k, h + pad), min(w0 + k, w + pad)
            pool_area = (h1 - h0) * (w1 - w0)
            hs, ws = max(h0, 0), max(w0, 0)
            he, we = min(h1, h), min(w1, w)
            window = x[:, :, hs:he, ws:we]
            if mode == "max":
                out[:, :, i, j] = window.max(axis=(2, 3))
            else:
                count = pool_area if count_include_pad else (he - hs) * (we - ws)
                out[:, :, i, j] = window.sum(axis=(2, 3)) / count
    return out


def cross_entropy(
    logits: np.ndarray, labels: np.ndarray, reduction: str = "mean", ignore_index: int | None = None
) -> np.ndarray:
    """Softmax cross-entropy of integer labels; ignored samples count 0 and "mean" divides
    by the samples kept (PyTorch's rule)."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    keep = np.ones(len(labels), bool) if ignore_index is None else labels != ignore_index
    losses = np.where(keep, -logp[np.arange(len(labels)), np.where(keep, labels, 0)], 0.0)
    if reduction == "none":
        return losses
    return np.asarray(losses.sum() if reduction == "sum" else losses.sum() / keep.sum())


def mlp_gradients(
    spec: ModelSpec, params: dict[str, np.ndarray], x: np.ndarray, labels: np.ndarray
) -> dict[str, np.ndarray]:
    """Exact gradients of the mean cross-entropy for a Flatten/Linear/ReLU spec."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    acts: list[tuple[str, Layer, np.ndarray]] = []
    h = x.astype(np.float64)
    for name, layer in spec.net.layers:
        acts.append((name, layer, h))
        h = _run(layer, name, p, h)
    z = h - h.max(axis=1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    grad = prob
    grad[np.arange(len(labels)), labels] -= 1.0
    grad /= len(labels)
    grads: dict[str, np.ndarray] = {}
    for name, layer, inp in reversed(acts):
        if isinstance(layer, Linear):
            grads[f"{name}.weight"] = grad.T @ inp
            grads[f"{name}.bias"] = grad.sum(axis=0)
            grad = grad @ p[f"{name}.weight"]
        elif isinstance(layer, ReLU):
            grad = grad * (inp > 0)
        elif isinstance(layer, Flatten):
            grad = grad.reshape(inp.shape)
        else:
            raise TypeError(f"mlp_gradients handles Flatten/Linear/ReLU, not {layer!r}")
    return grads
