"""Numpy reference backward of the neutral specs: the gradient yardstick of the conformance
suite.

Float64, written for clarity, not speed: one vector-Jacobian product per layer type,
chained through Sequential and Residual. ``train=True`` is the training forward
(BatchNorm normalises with the batch's biased statistics); dropout counts only where it
is the identity (``p == 0`` or eval mode), since its random mask cannot be matched.
"""

from __future__ import annotations

import numpy as np

from polytrain.neutral import reference, reference_attention, reference_rnn, reference_seq
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

Params = dict[str, np.ndarray]


def forward(spec: ModelSpec, params: Params, x: np.ndarray, *, train: bool = True) -> np.ndarray:
    """Logits of ``spec`` in training (``train=True``) or eval mode, in float64."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    return _forward(spec.net, "", p, x.astype(np.float64), train)


def loss_gradients(
    spec: ModelSpec, params: Params, x: np.ndarray, labels: np.ndarray, *, train: bool = True
) -> tuple[float, np.ndarray, Params]:
    """Mean cross-entropy of ``spec`` on ``(x, labels)``, its gradient w.r.t. ``x`` and
    w.r.t. every trainable parameter (canonical names), in float64."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    x64 = x.astype(np.float64)
    logits = _forward(spec.net, "", p, x64, train)
    loss = float(reference.cross_entropy(logits, labels))
    z = logits - logits.max(axis=1, keepdims=True)
    g = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    g[np.arange(len(labels)), labels] -= 1.0
    g /= len(labels)
    grads: Params = {}
    gx = _backward(spec.net, "", p, x64, g, train, grads)
    return loss, gx, grads


def _key(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _forward(layer: Layer, path: str, p: Params, x: np.ndarray, train: bool) -> np.ndarray:
    if isinstance(layer, Sequential):
        for name, child in layer.layers:
            x = _forward(child, _key(path, name), p, x, train)
        return x
    if isinstance(layer, Residual):
        y = _forward(layer.body, _key(path, "body"), p, x, train)
        s = (
            x
            if layer.shortcut is None
            else _forward(layer.shortcut, _key(path, "shortcut"), p, x, train)
        )
        return np.maximum(y + s, 0.0)
    if isinstance(layer, BatchNorm2d) and train:
        xhat, _ = _batch_normalise(x, layer.eps)
        return _affine(xhat, p, path)
    if isinstance(layer, SequenceLayer):
        run = lambda c, k, h: _forward(c, k, p, h, train)  # noqa: E731
        return reference_seq.forward(layer, path, p, x, train, run)
    if isinstance(layer, Dropout) and train and layer.p > 0:
        raise ValueError(f"no reference for dropout p={layer.p} in training (random mask)")
    return reference._run(layer, path, p, x)


def _backward(  # noqa: C901 - one branch per layer kind
    layer: Layer, path: str, p: Params, x: np.ndarray, g: np.ndarray, train: bool, grads: Params
) -> np.ndarray:
    """Gradient w.r.t. ``x`` of ``layer`` given ``g`` = d(loss)/d(output); adds the
    parameter gradients to ``grads``."""
    if isinstance(layer, Sequential):
        inputs = []
        for name, child in layer.layers:
            inputs.append(x)
            x = _forward(child, _key(path, name), p, x, train)
        for (name, child), inp in zip(reversed(layer.layers), reversed(inputs), strict=True):
            g = _backward(child, _key(path, name), p, inp, g, train, grads)
        return g
    if isinstance(layer, Residual):
        body, short = _key(path, "body"), _key(path, "shortcut")
        y = _forward(layer.body, body, p, x, train)
        s = x if layer.shortcut is None else _forward(layer.shortcut, short, p, x, train)
        gz = g * (y + s > 0)
        gx = _backward(layer.body, body, p, x, gz, train, grads)
        if layer.shortcut is None:
            return gx + gz
        return gx + _backward(layer.shortcut, short, p, x, gz, train, grads)
    if isinstance(layer, Conv2d):
        gx, gw, gb = conv2d_backward(x, p[_key(path, "weight")], g, layer.stride, layer.padding)
        grads[_key(path, "weight")] = gw
        if layer.bias:
            grads[_key(path, "bias")] = gb
        return gx
    if isinstance(layer, Linear):  # x [..., in]: every leading axis is a row
        rows = g.reshape(-1, g.shape[-1])
        grads[_key(path, "weight")] = rows.T @ x.reshape(-1, x.shape[-1])
        if layer.bias:
            grads[_key(path, "bias")] = rows.sum(axis=0)
        return g @ p[_key(path, "weight")]
    if isinstance(layer, BatchNorm2d):
        return _batch_norm_backward(layer, path, p, x, g, train, grads)
    if isinstance(layer, ReLU):
        return g * (x > 0)
    if isinstance(layer, MaxPool2d | AvgPool2d):
        return pool2d_backward(layer, x, g)
    if isinstance(layer, GlobalAvgPool2d):
        return np.broadcast_to(g / (x.shape[2] * x.shape[3]), x.shape).copy()
    if isinstance(layer, Flatten):
        return g.reshape(x.shape)
    if isinstance(layer, Dropout):
        _forward(layer, path, p, x, train)  # refuses a random mask
        return g
    if isinstance(layer, MultiHeadSelfAttention):
        weights = reference_attention.leaves(layer, p, path)
        _, cache = reference_attention.self_attention(layer, weights, x)
        gx, leaf_grads = reference_attention.self_attention_backward(layer, weights, x, cache, g)
        grads.update({_key(path, leaf): v for leaf, v in leaf_grads.items()})
        return gx
    if isinstance(layer, RecurrentLayer):
        weights = reference_rnn.leaves(layer, p, path)
        _, caches = reference_rnn.recurrent(layer, weights, x)
        gx, leaf_grads = reference_rnn.recurrent_backward(layer, weights, caches, g)
        grads.update({_key(path, leaf): v for leaf, v in leaf_grads.items()})
        return gx
    if isinstance(layer, SequenceLayer):
        back = lambda c, k, h, gh: _backward(c, k, p, h, gh, train, grads)  # noqa: E731
        return reference_seq.backward(layer, path, p, x, g, train, grads, back)
    raise TypeError(f"no reference backward for {layer!r}")


def conv2d_backward(
    x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: int, padding: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`polytrain.neutral.reference.conv2d` w.r.t. input, weight, bias."""
    h, wd = x.shape[2:]
    kh, kw = w.shape[2:]
    oh, ow = g.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    gxp = np.zeros_like(xp)
    gw = np.zeros_like(w)
    for i in range(kh):
        for j in range(kw):
            rows, cols = slice(i, i + stride * oh, stride), slice(j, j + stride * ow, stride)
            gw[:, :, i, j] = np.einsum("noab,ncab->oc", g, xp[:, :, rows, cols])
            gxp[:, :, rows, cols] += np.einsum("noab,oc->ncab", g, w[:, :, i, j])
    gx = gxp[:, :, padding : padding + h, padding : padding + wd]
    return gx, gw, g.sum(axis=(0, 2, 3))


def pool2d_backward(layer: MaxPool2d | AvgPool2d, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Gradient of max pooling (to each window's first maximum) or average pooling (the
    output's gradient over the window's divisor, as in the forward) w.r.t. the input."""
    k, pad = layer.kernel_size, layer.padding
    s = layer.stride or k
    n, c, h, w = x.shape
    gx = np.zeros_like(x)
    for i in range(g.shape[2]):
        for j in range(g.shape[3]):
            h0, w0 = i * s - pad, j * s - pad
            hs, ws, he, we = max(h0, 0), max(w0, 0), min(h0 + k, h), min(w0 + k, w)
            if isinstance(layer, MaxPool2d):
                window = x[:, :, hs:he, ws:we].reshape(n, c, -1)
                flat = window.argmax(axis=2)
                rows, cols = hs + flat // (we - ws), ws + flat % (we - ws)
                ni, ci = np.meshgrid(np.arange(n), np.arange(c), indexing="ij")
                gx[ni, ci, rows, cols] += g[:, :, i, j]
                continue
            pool_area = (min(h0 + k, h + pad) - h0) * (min(w0 + k, w + pad) - w0)
            count = pool_area if layer.count_include_pad else (he - hs) * (we - ws)
            gx[:, :, hs:he, ws:we] += g[:, :, i, j][:, :, None, None] / count
    return gx


def _batch_normalise(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(x - mean) / sqrt(var + eps)`` over N, H, W with the biased batch variance; and
    ``1 / sqrt(var + eps)``."""
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    inv_std = 1.0 / np.sqrt(x.var(axis=(0, 2, 3), keepdims=True) + eps)
    return (x - mean) * inv_std, inv_std


def _affine(xhat: np.ndarray, p: Params, path: str) -> np.ndarray:
    w = p[_key(path, "weight")][None, :, None, None]
    return xhat * w + p[_key(path, "bias")][None, :, None, None]


def _batch_norm_backward(
    layer: BatchNorm2d, path: str, p: Params, x: np.ndarray, g: np.ndarray, train: bool,
    grads: Params,
) -> np.ndarray:  # fmt: skip
    w = p[_key(path, "weight")][None, :, None, None]
    if train:
        xhat, inv_std = _batch_normalise(x, layer.eps)
    else:
        mean = p[_key(path, "running_mean")][None, :, None, None]
        inv_std = 1.0 / np.sqrt(p[_key(path, "running_var")][None, :, None, None] + layer.eps)
        xhat = (x - mean) * inv_std
    grads[_key(path, "weight")] = (g * xhat).sum(axis=(0, 2, 3))
    grads[_key(path, "bias")] = g.sum(axis=(0, 2, 3))
    gxhat = g * w
    if not train:
        return gxhat * inv_std
    m = x.shape[0] * x.shape[2] * x.shape[3]
    mean_g = gxhat.sum(axis=(0, 2, 3), keepdims=True) / m
    mean_gx = (gxhat * xhat).sum(axis=(0, 2, 3), keepdims=True) / m
    return inv_std * (gxhat - mean_g - xhat * mean_gx)
