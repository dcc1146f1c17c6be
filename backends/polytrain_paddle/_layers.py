"""Paddle layers for the neutral specs, with PyTorch's semantics where Paddle's differ.

Paddle's own BatchNorm keeps a biased running variance and weights the *old* statistic
by ``momentum``; its AvgPool excludes padding by default and, with ``ceil_mode``, can
produce one more window than PyTorch. The layers below keep Paddle's parameter names
(so a ``.pdparams`` loads into plain Paddle code) and compute PyTorch's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.autograd import PyLayer

from polytrain.errors import BackendError
from polytrain.neutral import dropout_masks, models
from polytrain.neutral.reference import pool_output_size

from ._rnn_layers import RECURRENT_BUILDERS
from ._seq_layers import SEQUENCE_BUILDERS, Add, batch_norm_1d

_RENAME = {"_mean": "running_mean", "_variance": "running_var"}  # Paddle BatchNorm buffers


class _Residual(nn.Layer):
    def __init__(self, body: nn.Layer, shortcut: nn.Layer | None) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        s = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.body(x) + s)


class _ChannelBias(PyLayer):
    """``y + b`` over the channels of an NCHW ``y``, whose backward sums the gradient over
    N, H and W in one reduction: Paddle's broadcast add spent ~20 ms per LeNet step there
    (docs/performance.md, "Paddle's convolution bias")."""

    @staticmethod
    def forward(ctx: object, y: paddle.Tensor, b: paddle.Tensor) -> paddle.Tensor:
        return y + b.reshape([1, -1, 1, 1])

    @staticmethod
    def backward(ctx: object, grad: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        return grad, grad.sum(axis=[0, 2, 3])


class _Conv2D(nn.Conv2D):
    """Paddle's Conv2D (same parameters and names) whose bias is added by
    :class:`_ChannelBias` in dygraph; compiled (to_static) it is Paddle's own."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.bias is None or not paddle.in_dynamic_mode():
            return super().forward(x)
        y = F.conv2d(
            x, self.weight, None, self._stride, self._padding, self._dilation, self._groups
        )
        return cast(paddle.Tensor, _ChannelBias.apply(y, self.bias))


class _BatchNorm2D(nn.BatchNorm2D):
    """Paddle's BatchNorm2D (same parameters and state-dict names) with PyTorch's running
    statistics: ``momentum`` weights the new batch and running_var is unbiased."""

    def __init__(self, layer: models.BatchNorm2d) -> None:
        super().__init__(layer.num_features, momentum=1.0 - layer.momentum, epsilon=layer.eps)
        self._torch_momentum = layer.momentum

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if not self.training:
            if x.dtype == paddle.float64:  # the fused kernel's float32 epsilon, see below
                shape = [1, -1, 1, 1]
                weight, bias = self._affine()
                scale = weight / paddle.sqrt(self._variance + self._epsilon)
                shift = bias - self._mean * scale
                return x * scale.reshape(shape) + shift.reshape(shape)
            return super().forward(x)
        # Momentum 0 makes Paddle's fused kernel write the batch mean and biased variance
        # into these scratch tensors; the running stats are then updated as torch does.
        if x.dtype == paddle.float64:
            y, mean, var = self._float64_train(x)
        else:
            mean, var = paddle.zeros_like(self._mean), paddle.zeros_like(self._variance)
            y = F.batch_norm(
                x, mean, var, self.weight, self.bias, training=True, momentum=0.0,
                epsilon=self._epsilon,
            )  # fmt: skip
        n = math.prod(x.shape) // x.shape[1]
        m = self._torch_momentum
        with paddle.no_grad():
            paddle.assign(self._mean * (1 - m) + mean * m, output=self._mean)
            unbiased = var * (n / max(n - 1, 1))
            paddle.assign(self._variance * (1 - m) + unbiased * m, output=self._variance)
        return y

    def _affine(self) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Weight and bias (Paddle types them optional; this layer always has both)."""
        return cast(paddle.Tensor, self.weight), cast(paddle.Tensor, self.bias)

    def _float64_train(self, x: paddle.Tensor) -> tuple[paddle.Tensor, ...]:
        """Train-mode BatchNorm from element-wise ops, for float64 models (--precision fp64):
        Paddle 3.3.1's fused kernel takes ``epsilon`` as a float32 attribute (1e-5 becomes
        9.99999975e-6: outputs off by ~7e-14, a loss by ~1e-12); these ops stay float64."""
        mean = x.mean(axis=[0, 2, 3], keepdim=True)
        centered = x - mean
        var = (centered * centered).mean(axis=[0, 2, 3], keepdim=True)
        shape = [1, -1, 1, 1]
        y = centered / paddle.sqrt(var + self._epsilon)
        weight, bias = self._affine()
        y = y * weight.reshape(shape) + bias.reshape(shape)
        return y, mean.detach().flatten(), var.detach().flatten()


class _GlobalAvgPool2D(nn.AdaptiveAvgPool2D):
    """Global average pooling; float64 models take ``mean``, whose backward stays float64
    (Paddle 3.3.1's adaptive-pool backward scales by a float32 1/(H*W): 1/9 is off by 3e-8)."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if x.dtype == paddle.float64:
            return x.mean(axis=[2, 3], keepdim=True)
        return super().forward(x)


class _AvgPool2D(nn.AvgPool2D):
    """AvgPool with PyTorch's rules: padding counts (``exclusive=False``) and, with
    ``ceil_mode``, no last window that starts in the right padding."""

    def __init__(self, layer: models.AvgPool2d) -> None:
        k, s, pad = layer.kernel_size, layer.stride or layer.kernel_size, layer.padding
        super().__init__(
            k, s, pad, ceil_mode=layer.ceil_mode, exclusive=not layer.count_include_pad
        )
        self._k, self._s, self._pad, self._ceil = k, s, pad, layer.ceil_mode
        self._exclusive = not layer.count_include_pad

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if x.dtype == paddle.float64:
            return self._float64(x)
        y = super().forward(x)
        if not self._ceil:
            return y
        oh, ow = (pool_output_size(n, self._k, self._s, self._pad, True) for n in x.shape[2:])
        return y if tuple(y.shape[2:]) == (oh, ow) else y[:, :, :oh, :ow]

    def _float64(self, x: paddle.Tensor) -> paddle.Tensor:
        """Window sums (a depthwise float64 convolution with ones) over each window's
        divisor, for float64 models: Paddle 3.3.1's pool backward divides by a float32
        count when padding is involved (1/9 off by 3e-8, found by the conformance suite)."""
        k, s, pad, c = self._k, self._s, self._pad, x.shape[1]
        sizes = [int(n) for n in x.shape[2:]]
        outs = [pool_output_size(n, k, s, pad, self._ceil) for n in sizes]
        right = [(o - 1) * s + k - n - pad for n, o in zip(sizes, outs, strict=True)]
        x = F.pad(x, [pad, max(right[1], 0), pad, max(right[0], 0)])  # left, right, top, bottom
        x = x[:, :, : pad + sizes[0] + right[0], : pad + sizes[1] + right[1]]
        ones = paddle.ones([c, 1, k, k], dtype=x.dtype)
        sums = F.conv2d(x, ones, stride=s, groups=c)
        counts = [self._counts(n, o) for n, o in zip(sizes, outs, strict=True)]
        divisor = paddle.to_tensor(counts[0][:, None] * counts[1][None, :], dtype=x.dtype)
        return sums / divisor

    def _counts(self, size: int, out: int) -> np.ndarray:
        """Per output index along one axis, how many positions the divisor counts."""
        k, s, pad = self._k, self._s, self._pad
        start = np.arange(out) * s - pad
        if self._exclusive:
            return np.minimum(start + k, size) - np.maximum(start, 0)
        return np.minimum(start + k, size + pad) - start


class _SelfAttention(nn.Layer):
    """Self-attention from Paddle's own matmuls, holding PyTorch's ``in_proj_weight``
    [3E, E] / ``in_proj_bias`` (not paddle.nn.MultiHeadAttention's q/k/v_proj: a
    converted name maps one tensor to one tensor, never a split) and an ``out_proj``
    nn.Linear (so [in, out], as every Paddle Linear). Scale and mask are tensors of the
    input's dtype: Paddle's scale op takes a float32 attribute, off in float64 models."""

    def __init__(self, layer: models.MultiHeadSelfAttention) -> None:
        super().__init__()
        e = layer.embed_dim
        self.heads, self.causal, self.bias = layer.num_heads, layer.causal, layer.bias
        self.in_proj_weight = self.create_parameter([3 * e, e])
        self.in_proj_bias = self.create_parameter([3 * e], is_bias=True) if layer.bias else None
        self.out_proj = nn.Linear(e, e, bias_attr=None if layer.bias else False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        t, e = int(x.shape[1]), int(x.shape[2])
        d, dtype = e // self.heads, "float64" if x.dtype == paddle.float64 else "float32"
        qkv = paddle.matmul(x, self.in_proj_weight, transpose_y=True)
        if self.in_proj_bias is not None:
            qkv = qkv + self.in_proj_bias
        qkv = qkv.reshape([0, 0, 3, self.heads, d]).transpose([2, 0, 3, 1, 4])
        scale = paddle.to_tensor(np.asarray(math.sqrt(d), dtype))
        scores = paddle.matmul(qkv[0], qkv[1], transpose_y=True) / scale
        if self.causal:
            mask = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, 0.0).astype(dtype)
            scores = scores + paddle.to_tensor(mask)
        context = paddle.matmul(F.softmax(scores, axis=-1), qkv[2])
        return self.out_proj(context.transpose([0, 2, 1, 3]).reshape([0, 0, e]))


class _Dropout(nn.Dropout):
    """nn.Dropout, whose training mask comes from numpy while a parity step is open
    (``dropout_masks="parity"``, polytrain.neutral.dropout_masks)."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if not self.training or self.p == 0:
            return super().forward(x)
        dtype = "float64" if x.dtype == paddle.float64 else "float32"
        mask = dropout_masks.parity_mask(tuple(x.shape), self.p, dtype)
        if mask is None:
            return super().forward(x)
        if not paddle.in_dynamic_mode():
            raise BackendError("Parity dropout masks need dygraph: run without --fast.")
        return x * paddle.to_tensor(mask, place=x.place)


def _build_sequential(layer: models.Sequential) -> nn.Layer:
    return nn.Sequential(*[(n, build(c)) for n, c in layer.layers])


def _build_residual(layer: models.Residual) -> nn.Layer:
    short = None if layer.shortcut is None else build(layer.shortcut)
    return _Residual(build(layer.body), short)


def _build_add(layer: models.Add) -> nn.Layer:
    return Add([build(branch) for branch in layer.branches])


def _build_conv2d(layer: models.Conv2d) -> nn.Layer:
    return _Conv2D(
        layer.in_channels,
        layer.out_channels,
        layer.kernel_size,
        stride=layer.stride,
        padding=layer.padding,
        bias_attr=None if layer.bias else False,
    )


def _build_linear(layer: models.Linear) -> nn.Layer:
    return nn.Linear(layer.in_features, layer.out_features, bias_attr=None if layer.bias else False)


def _build_max_pool_2d(layer: models.MaxPool2d) -> nn.Layer:
    return nn.MaxPool2D(layer.kernel_size, layer.stride, layer.padding)


#: every spec layer type's builder: the layer -> its Paddle layer
BUILDERS: dict[type, Callable[[Any], nn.Layer]] = {
    models.Sequential: _build_sequential,
    models.Residual: _build_residual,
    models.Add: _build_add,
    models.Conv2d: _build_conv2d,
    models.Linear: _build_linear,
    models.BatchNorm2d: _BatchNorm2D,
    models.BatchNorm1d: lambda layer: batch_norm_1d(_BatchNorm2D, layer),
    models.ReLU: lambda _: nn.ReLU(),
    models.MaxPool2d: _build_max_pool_2d,
    models.AvgPool2d: _AvgPool2D,
    models.GlobalAvgPool2d: lambda _: _GlobalAvgPool2D(1),
    models.Flatten: lambda _: nn.Flatten(),
    models.Dropout: lambda layer: _Dropout(layer.p),
    models.MultiHeadSelfAttention: _SelfAttention,
    **SEQUENCE_BUILDERS,
    **RECURRENT_BUILDERS,
}


def build(layer: models.Layer) -> nn.Layer:
    """The layer of ``layer``: the builder of its type (or nearest base) in :data:`BUILDERS`."""
    builder = next((BUILDERS[t] for t in type(layer).__mro__ if t in BUILDERS), None)
    if builder is None:
        raise BackendError(f"paddle backend cannot build layer {layer!r}")
    return builder(layer)


def canonical_layout(layer: nn.Layer) -> dict[str, tuple[str, bool]]:
    """Native state-dict name -> (canonical name, transposed?) for every entry."""
    linear = {
        f"{p}.weight" if p else "weight"
        for p, sub in layer.named_sublayers(include_self=True)
        if isinstance(sub, nn.Linear)
    }
    out = {}
    for key in layer.state_dict():
        head, _, leaf = key.rpartition(".")
        leaf = _RENAME.get(leaf, leaf)
        out[key] = (f"{head}.{leaf}" if head else leaf, key in linear)
    return out


def unwrap(layer: nn.Layer) -> nn.Layer:
    """The user's layer inside paddle.DataParallel (whose child is ``_layers``)."""
    while isinstance(layer, paddle.DataParallel):
        layer = layer._layers
    return layer
