"""The numeric kernels, forward and backward, on plain arrays (NCHW, OIHW: PyTorch's).

Vectorised over the batch: convolution is an im2col matrix product, pooling and its
gradient loop only over the positions of the window, never over samples or pixels.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from polytrain.errors import BackendError
from polytrain.neutral.reference import pool_output_size


def _pad(x: np.ndarray, before: int, after_h: int, after_w: int, value: float) -> np.ndarray:
    if not (before or after_h or after_w):
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + before + after_h, w + before + after_w), value, dtype=x.dtype)
    out[:, :, before : before + h, before : before + w] = x
    return out


def _windows(xp: np.ndarray, k: int, s: int, oh: int, ow: int) -> np.ndarray:
    """A read-only view [N, C, OH, OW, K, K] of every window of the padded ``xp``."""
    sn, sc, sh, sw = xp.strides
    n, c = xp.shape[:2]
    return as_strided(xp, (n, c, oh, ow, k, k), (sn, sc, sh * s, sw * s, sh, sw), writeable=False)


def _scatter(dxp: np.ndarray, part: np.ndarray, i: int, j: int, s: int) -> None:
    """Add ``part`` [N, C, OH, OW] (or [C, N, OH, OW] into a [C, N, H, W] ``dxp``) into
    the window offset (i, j) of every output position."""
    oh, ow = part.shape[2:]
    dxp[:, :, i : i + s * (oh - 1) + 1 : s, j : j + s * (ow - 1) + 1 : s] += part


def _crop(dxp: np.ndarray, pad: int, shape: tuple[int, ...]) -> np.ndarray:
    """The input's part of a padded gradient (itself when there is no padding around it)."""
    if dxp.shape == tuple(shape):
        return dxp
    return np.ascontiguousarray(dxp[:, :, pad : pad + shape[2], pad : pad + shape[3]])


# -- convolution ------------------------------------------------------------------------------


def im2col(x: np.ndarray, k: int, stride: int, padding: int) -> tuple[np.ndarray, int, int]:
    """Every receptive field as a column: [C*K*K, N*OH*OW] (rows c, i, j), with OH, OW."""
    xp = _pad(x, padding, padding, padding, 0.0)
    n, c, h, w = xp.shape
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    if oh < 1 or ow < 1:
        raise BackendError(f"conv2d: a {k}x{k} kernel does not fit an input of {x.shape[2:]}.")
    sn, sc, sh, sw = xp.strides
    view = as_strided(
        xp, (c, k, k, n, oh, ow), (sc, sh, sw, sn, sh * stride, sw * stride), writeable=False
    )
    return view.reshape(c * k * k, n * oh * ow), oh, ow


def conv2d(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, padding: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cross-correlation of NCHW ``x`` with OIHW ``w`` (+ ``b``); also the im2col columns."""
    n = x.shape[0]
    o = w.shape[0]
    if w.shape[1] != x.shape[1]:
        raise BackendError(
            f"conv2d: weight {w.shape} expects {w.shape[1]} input channels, got {x.shape}."
        )
    cols, oh, ow = im2col(x, w.shape[2], stride, padding)
    y = (w.reshape(o, -1) @ cols).reshape(o, n, oh, ow).transpose(1, 0, 2, 3)
    out = np.empty((n, o, oh, ow), dtype=y.dtype)
    if b is None:
        np.copyto(out, y)
    else:
        np.add(y, b.reshape(1, o, 1, 1), out=out)
    return out, cols


def conv2d_backward(
    g: np.ndarray,
    cols: np.ndarray,
    x_shape: tuple[int, ...],
    w: np.ndarray,
    stride: int,
    padding: int,
    need_x: bool,
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Gradients of :func:`conv2d` for input (if ``need_x``), weight and bias."""
    n, o, oh, ow = g.shape
    k = w.shape[2]
    gm = np.ascontiguousarray(g.transpose(1, 0, 2, 3)).reshape(o, n * oh * ow)
    gw = (gm @ cols.T).reshape(w.shape)
    gb = gm.sum(axis=1)
    if not need_x:
        return None, gw, gb
    c = x_shape[1]
    # [C, K, K, N, OH, OW]: each window offset is one block to add back, into the padded
    # input's gradient laid out [C, N, H, W] as the blocks are (a contiguous read each; the
    # same additions in the same order as into NCHW), made NCHW once at the end
    dcols = (w.reshape(o, -1).T @ gm).reshape(c, k, k, n, oh, ow)
    h, wd = x_shape[2] + 2 * padding, x_shape[3] + 2 * padding
    dxp = np.zeros((c, n, h, wd), dtype=g.dtype)
    for i in range(k):
        for j in range(k):
            _scatter(dxp, dcols[:, i, j], i, j, stride)
    inside = dxp[:, :, padding : padding + x_shape[2], padding : padding + x_shape[3]]
    return np.ascontiguousarray(inside.transpose(1, 0, 2, 3)), gw, gb


# -- pooling ----------------------------------------------------------------------------------


def max_pool2d(x: np.ndarray, k: int, s: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Max pooling (padding never wins; output size rounds down); also the arg-max of
    each window (its first maximum, as PyTorch picks)."""
    if pad > k // 2:
        raise BackendError(f"max_pool2d: padding {pad} must be at most half the kernel {k}.")
    h, w = x.shape[2:]
    oh, ow = pool_output_size(h, k, s, pad, False), pool_output_size(w, k, s, pad, False)
    xp = _pad(x, pad, pad, pad, -np.inf)
    flat = _windows(xp, k, s, oh, ow).reshape(*x.shape[:2], oh, ow, k * k)
    idx = flat.argmax(axis=-1)
    out = np.take_along_axis(flat, idx[..., None], axis=-1)[..., 0]
    return out, idx


def max_pool2d_backward(
    g: np.ndarray, idx: np.ndarray, x_shape: tuple[int, ...], k: int, s: int, pad: int
) -> np.ndarray:
    n, c, h, w = x_shape
    dxp = np.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=g.dtype)
    for q in range(k * k):
        i, j = divmod(q, k)
        _scatter(dxp, np.where(idx == q, g, 0), i, j, s)
    return _crop(dxp, pad, x_shape)


def _avg_divisor(size: int, out: int, k: int, s: int, pad: int, include_pad: bool) -> np.ndarray:
    """Per output position along one axis, the window length PyTorch divides by."""
    start = np.arange(out) * s - pad
    end = np.minimum(start + k, size + pad)
    if not include_pad:
        return np.minimum(end, size) - np.maximum(start, 0)
    return end - start


def _window_sum(xp: np.ndarray, k: int, s: int, oh: int, ow: int) -> np.ndarray:
    """Sum of every k x k window, one strided slice per offset (in the window's row-major
    order, as PyTorch adds them)."""
    total: np.ndarray | None = None
    for i in range(k):
        for j in range(k):
            part = xp[:, :, i : i + s * (oh - 1) + 1 : s, j : j + s * (ow - 1) + 1 : s]
            if total is None:
                total = part.copy()
            else:
                total += part
    assert total is not None
    return total


def avg_pool2d(
    x: np.ndarray, k: int, s: int, pad: int, ceil_mode: bool, include_pad: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Average pooling with PyTorch's rules; also the divisor of each output [OH, OW]."""
    if pad > k // 2:
        raise BackendError(f"avg_pool2d: padding {pad} must be at most half the kernel {k}.")
    h, w = x.shape[2:]
    oh, ow = pool_output_size(h, k, s, pad, ceil_mode), pool_output_size(w, k, s, pad, ceil_mode)
    div = np.outer(
        _avg_divisor(h, oh, k, s, pad, include_pad), _avg_divisor(w, ow, k, s, pad, include_pad)
    ).astype(x.dtype)
    right_h, right_w = (oh - 1) * s + k - h - pad, (ow - 1) * s + k - w - pad
    xp = _pad(x, pad, max(right_h, 0), max(right_w, 0), 0.0)
    total = _window_sum(xp, k, s, oh, ow)
    total /= div
    return total, div


def avg_pool2d_backward(
    g: np.ndarray, div: np.ndarray, x_shape: tuple[int, ...], k: int, s: int, pad: int
) -> np.ndarray:
    n, c, h, w = x_shape
    share = g / div
    oh, ow = g.shape[2:]
    full_h, full_w = max(h + 2 * pad, (oh - 1) * s + k), max(w + 2 * pad, (ow - 1) * s + k)
    tiled = s == k and (full_h, full_w) == (oh * k, ow * k)  # every input in one window
    dxp = (np.empty if tiled else np.zeros)((n, c, full_h, full_w), dtype=g.dtype)
    for i in range(k):
        for j in range(k):
            if tiled:
                dxp[:, :, i::s, j::s] = share
            else:
                _scatter(dxp, share, i, j, s)
    return _crop(dxp, pad, x_shape)


# -- batch normalisation ------------------------------------------------------------------------


def batch_norm_train(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    eps: float,
    momentum: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training-mode BatchNorm2d: batch statistics; the running ones updated in place
    with PyTorch's momentum and unbiased variance. Returns (y, x_hat, 1/std)."""
    n = x.shape[0] * x.shape[2] * x.shape[3]
    if n < 2:
        raise BackendError(
            f"BatchNorm2d in training needs more than one value per channel, got input "
            f"{x.shape}: use a larger batch (or train=False)."
        )
    mean = x.mean(axis=(0, 2, 3))
    centred = x - mean.reshape(1, -1, 1, 1)
    var = np.square(centred).mean(axis=(0, 2, 3))
    inv_std = 1.0 / np.sqrt(var + eps)
    x_hat = centred * inv_std.reshape(1, -1, 1, 1)
    y = x_hat * weight.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)
    running_mean *= 1 - momentum
    running_mean += momentum * mean
    running_var *= 1 - momentum
    running_var += momentum * var * (n / (n - 1))
    return y, x_hat, inv_std.astype(x.dtype, copy=False)


def batch_norm_train_backward(
    g: np.ndarray, x_hat: np.ndarray, inv_std: np.ndarray, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of training-mode BatchNorm for input, weight and bias."""
    n = g.shape[0] * g.shape[2] * g.shape[3]
    gb = g.sum(axis=(0, 2, 3))
    gw = (g * x_hat).sum(axis=(0, 2, 3))
    shape = (1, -1, 1, 1)
    scale = (weight * inv_std).reshape(shape) / n
    dx = scale * (n * g - gb.reshape(shape) - x_hat * gw.reshape(shape))
    return dx, gw, gb


def batch_norm_eval(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    eps: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Eval-mode BatchNorm2d from the running statistics; also the per-channel scale."""
    scale = weight / np.sqrt(running_var + eps)
    shift = bias - running_mean * scale
    return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1), scale


# -- loss ---------------------------------------------------------------------------------------


def cross_entropy(
    logits: np.ndarray, labels: np.ndarray, ignore_index: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample softmax cross-entropy (0 where ignored), the kept mask and softmax."""
    if logits.ndim != 2:
        raise BackendError(f"cross_entropy takes logits [N, C], got shape {logits.shape}.")
    if labels.ndim == 2 and labels.shape[1] == 1:  # Paddle/MXNet-style [N, 1]
        labels = labels.reshape(-1)
    if labels.shape != (logits.shape[0],) or labels.dtype.kind not in "iu":
        raise BackendError(
            f"cross_entropy takes integer labels [N] or [N, 1] for logits {logits.shape}, "
            f"got {labels.dtype} {labels.shape}."
        )
    keep = np.ones(len(labels), bool) if ignore_index is None else labels != ignore_index
    classes = logits.shape[1]
    bad = labels[keep & ((labels < 0) | (labels >= classes))]
    if bad.size:
        raise BackendError(
            f"cross_entropy: label {int(bad[0])} is out of range for {classes} classes."
        )
    safe = np.where(keep, labels, 0)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    losses = np.log(total[:, 0]) - shifted[rows, safe]
    return np.where(keep, losses, 0).astype(logits.dtype, copy=False), keep, exp / total


def cross_entropy_backward(
    per_sample: np.ndarray, softmax: np.ndarray, labels: np.ndarray, keep: np.ndarray
) -> np.ndarray:
    """d(sum_i per_sample[i] * loss_i)/d(logits)."""
    labels = labels.reshape(-1)
    grad = softmax.copy()
    grad[np.arange(len(labels)), np.where(keep, labels, 0)] -= 1
    grad *= np.where(keep, per_sample, 0).astype(grad.dtype, copy=False)[:, None]
    return grad
