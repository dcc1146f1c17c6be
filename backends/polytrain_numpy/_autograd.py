"""Differentiable operations on :class:`~._tensor.Tensor`: each runs a kernel forward
and records how its output's gradient maps to its inputs'."""

from __future__ import annotations

import numpy as np

from polytrain.backend.reduction import check_reduction
from polytrain.neutral import reference_attention
from polytrain.neutral.models import MultiHeadSelfAttention

from . import _kernels as K
from ._tensor import Grads, NumpyDevice, Tensor, record


def conv2d(x: Tensor, w: Tensor, b: Tensor | None, stride: int = 1, padding: int = 0) -> Tensor:
    with np.errstate(all="ignore"):
        out, cols = K.conv2d(x.data, w.data, None if b is None else b.data, stride, padding)
    inputs = (x, w) if b is None else (x, w, b)

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            gx, gw, gb = K.conv2d_backward(
                g, cols, x.shape, w.data, stride, padding, x.requires_grad
            )
        return (gx, gw) if b is None else (gx, gw, gb)

    return record(out, inputs, vjp)


def linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """``x @ w.T + b`` on x [..., in] (PyTorch's Linear, weight [out, in])."""
    with np.errstate(all="ignore"):
        out = x.data @ w.data.T
        if b is not None:
            out += b.data
    inputs = (x, w) if b is None else (x, w, b)

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            gx = g @ w.data if x.requires_grad else None
            rows = g.reshape(-1, g.shape[-1])  # [..., out]: every leading axis is a row
            gw = rows.T @ x.data.reshape(-1, x.data.shape[-1])
            return (gx, gw) if b is None else (gx, gw, rows.sum(axis=0))

    return record(out, inputs, vjp)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product of 2-d tensors."""
    with np.errstate(all="ignore"):
        out = a.data @ b.data

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            ga = g @ b.data.T if a.requires_grad else None
            gb = a.data.T @ g if b.requires_grad else None
        return ga, gb

    return record(out, (a, b), vjp)


def relu(x: Tensor) -> Tensor:
    with np.errstate(all="ignore"):
        out = np.maximum(x.data, 0)

    def vjp(g: np.ndarray) -> Grads:
        return (np.where(out > 0, g, 0).astype(g.dtype, copy=False),)

    return record(out, (x,), vjp)


def max_pool2d(x: Tensor, k: int, s: int, pad: int) -> Tensor:
    out, idx = K.max_pool2d(x.data, k, s, pad)

    def vjp(g: np.ndarray) -> Grads:
        return (K.max_pool2d_backward(g, idx, x.shape, k, s, pad),)

    return record(out, (x,), vjp)


def avg_pool2d(
    x: Tensor, k: int, s: int, pad: int, ceil_mode: bool = False, include_pad: bool = True
) -> Tensor:
    with np.errstate(all="ignore"):
        out, div = K.avg_pool2d(x.data, k, s, pad, ceil_mode, include_pad)

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            return (K.avg_pool2d_backward(g, div, x.shape, k, s, pad),)

    return record(out, (x,), vjp)


def global_avg_pool2d(x: Tensor) -> Tensor:
    with np.errstate(all="ignore"):
        out = x.data.mean(axis=(2, 3), keepdims=True)
    area = x.shape[2] * x.shape[3]

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            return (np.broadcast_to(g / area, x.shape).copy(),)

    return record(out, (x,), vjp)


def reshape(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    out = x.data.reshape(shape)

    def vjp(g: np.ndarray) -> Grads:
        return (g.reshape(x.shape),)

    return record(out, (x,), vjp)


def flatten(x: Tensor) -> Tensor:
    return reshape(x, (x.shape[0], -1))


def batch_norm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    eps: float,
    momentum: float,
    train: bool,
) -> Tensor:
    """BatchNorm2d: batch statistics (running ones updated) in training, else running ones."""
    with np.errstate(all="ignore"):
        if train:
            out, x_hat, inv_std = K.batch_norm_train(
                x.data, weight.data, bias.data, running_mean, running_var, eps, momentum
            )
        else:
            out, scale = K.batch_norm_eval(
                x.data, weight.data, bias.data, running_mean, running_var, eps
            )

    def vjp_train(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            return K.batch_norm_train_backward(g, x_hat, inv_std, weight.data)

    def vjp_eval(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            shape = (1, -1, 1, 1)
            normed = (x.data - running_mean.reshape(shape)) * (scale / weight.data).reshape(shape)
            return g * scale.reshape(shape), (g * normed).sum(axis=(0, 2, 3)), g.sum(axis=(0, 2, 3))

    return record(out, (x, weight, bias), vjp_train if train else vjp_eval)


def dropout(x: Tensor, p: float, rng: np.random.Generator) -> Tensor:
    """Inverted dropout (training): zero with probability ``p``, scale the rest by 1/(1-p)."""
    keep = 1.0 - p
    mask = (rng.random(x.shape) < keep).astype(x.dtype)
    if keep > 0:
        mask /= keep
    out = x.data * mask

    def vjp(g: np.ndarray) -> Grads:
        return (g * mask,)

    return record(out, (x,), vjp)


def self_attention(layer: MultiHeadSelfAttention, x: Tensor, weights: dict[str, Tensor]) -> Tensor:
    """Multi-head self-attention (``weights`` by leaf name: in_proj_weight, ...), by the
    reference's own functions in this tensor's dtype: the numpy backend is its twin."""
    names = list(weights)
    arrays = {n: weights[n].data for n in names}
    with np.errstate(all="ignore"):
        out, cache = reference_attention.self_attention(layer, arrays, x.data)

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            gx, grads = reference_attention.self_attention_backward(layer, arrays, x.data, cache, g)
        return (gx, *(grads[n] for n in names))

    return record(out, (x, *(weights[n] for n in names)), vjp)


def multiply_by(x: Tensor, mask: np.ndarray) -> Tensor:
    """``x * mask`` for a constant ``mask`` (a given dropout mask)."""
    out = x.data * mask

    def vjp(g: np.ndarray) -> Grads:
        return (g * mask,)

    return record(out, (x,), vjp)


def copy_to(x: Tensor, device: NumpyDevice) -> Tensor:
    """A copy on ``device`` through which the gradient flows back."""

    def vjp(g: np.ndarray) -> Grads:
        return (g,)

    return record(x.data.copy(), (x,), vjp, device=device)


def cross_entropy(
    logits: Tensor, labels: Tensor, reduction: str, ignore_index: int | None
) -> Tensor:
    """Softmax cross-entropy: "none", "sum" or "mean" over the kept samples."""
    check_reduction(reduction)
    y = labels.data
    with np.errstate(all="ignore"):
        losses, keep, softmax = K.cross_entropy(logits.data, y, ignore_index)
        kept = int(keep.sum())
        if reduction == "none":
            out = losses
        elif reduction == "sum":
            out = np.asarray(losses.sum(), dtype=losses.dtype)
        else:
            out = np.asarray(losses.sum() / kept if kept else np.nan, dtype=losses.dtype)

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            if reduction == "none":
                per_sample = g
            else:
                weight = g if reduction == "sum" else g / kept if kept else g * np.nan
                per_sample = np.broadcast_to(weight, losses.shape)
            return K.cross_entropy_backward(per_sample, softmax, y, keep), None

    return record(out, (logits, labels), vjp)
