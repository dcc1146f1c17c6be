"""Paddle layers for the sequence and transformer layers, with PyTorch's numbers: Paddle's
own where it agrees (Conv1D, Embedding and the activations keep Paddle's names, which
are PyTorch's here), element-wise float64-exact forms where its fused kernels do not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paddle
from paddle import nn

from polytrain.neutral import models


class Add(nn.Layer):
    """The element-wise sum of the branches (``branches.<i>``) on one input."""

    def __init__(self, branches: list[nn.Layer]) -> None:
        super().__init__()
        self.branches = nn.LayerList(branches)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        outs = [branch(x) for branch in self.branches]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total


class Reshape(nn.Layer):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = list(shape)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x.reshape([x.shape[0], *self.shape])


class Transpose(nn.Layer):
    def __init__(self, dim0: int, dim1: int) -> None:
        super().__init__()
        self.dims = (dim0, dim1)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        axes = list(range(x.ndim))
        a, b = (d % x.ndim for d in self.dims)
        axes[a], axes[b] = b, a
        return x.transpose(axes)


class Mean(nn.Layer):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x.mean(axis=self.dim)


class LayerNorm(nn.Layer):
    """LayerNorm with weight and bias of the normalized shape (Paddle's nn.LayerNorm
    flattens them to one axis), from element-wise ops: Paddle's fused kernel takes epsilon
    as a float32 attribute, which float64 models must not see."""

    def __init__(self, layer: models.LayerNorm) -> None:
        super().__init__()
        self.weight: paddle.Tensor | None = None
        self.bias: paddle.Tensor | None = None
        if layer.elementwise_affine:
            shape = list(layer.normalized_shape)
            self.weight = self.create_parameter(
                shape, default_initializer=nn.initializer.Constant(1.0)
            )
            self.bias = self.create_parameter(shape, is_bias=True)
        self._axes = list(range(-len(layer.normalized_shape), 0))
        self._eps = layer.eps

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        centered = x - x.mean(axis=self._axes, keepdim=True)
        var = (centered * centered).mean(axis=self._axes, keepdim=True)
        y = centered / paddle.sqrt(var + self._eps)
        if self.weight is None or self.bias is None:
            return y
        return y * self.weight + self.bias


class PositionalEmbedding(nn.Layer):
    """``x + weight[:T]`` for x [N, T, E]; weight [max_len, E]."""

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.weight = self.create_parameter([max_len, dim])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x + self.weight[: x.shape[1]]


def batch_norm_1d(batch_norm_2d: type[nn.Layer], layer: models.BatchNorm1d) -> nn.Layer:
    """polytrain's Paddle BatchNorm2D (PyTorch's statistics) run on [N, C, L, 1]."""

    class BatchNorm1D(batch_norm_2d):  # type: ignore[valid-type, misc]
        def forward(self, x: paddle.Tensor) -> paddle.Tensor:
            shape = x.shape
            return super().forward(x.reshape([shape[0], shape[1], -1, 1])).reshape(shape)

    return BatchNorm1D(layer)


def _conv1d(layer: models.Conv1d) -> nn.Layer:
    return nn.Conv1D(
        layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride,
        padding=layer.padding, bias_attr=None if layer.bias else False,
    )  # fmt: skip


def _embedding(layer: models.Embedding) -> nn.Layer:
    return nn.Embedding(layer.num_embeddings, layer.embedding_dim)


def _positional_embedding(layer: models.PositionalEmbedding) -> nn.Layer:
    return PositionalEmbedding(layer.max_len, layer.embedding_dim)


def _gelu(layer: models.GELU) -> nn.Layer:
    return nn.GELU(approximate=layer.approximate == "tanh")


#: the leaf sequence/transformer layers' builders (``Add``, a container, and
#: ``BatchNorm1d``, on _layers' BatchNorm2D, are _layers')
SEQUENCE_BUILDERS: dict[type, Callable[[Any], nn.Layer]] = {
    models.Reshape: lambda layer: Reshape(layer.shape),
    models.Transpose: lambda layer: Transpose(layer.dim0, layer.dim1),
    models.Mean: lambda layer: Mean(layer.dim),
    models.Conv1d: _conv1d,
    models.LayerNorm: LayerNorm,
    models.Embedding: _embedding,
    models.PositionalEmbedding: _positional_embedding,
    models.GELU: _gelu,
    models.SiLU: lambda _: nn.Silu(),
    models.Tanh: lambda _: nn.Tanh(),
    models.Sigmoid: lambda _: nn.Sigmoid(),
    models.Softmax: lambda layer: nn.Softmax(layer.dim),
    models.LogSoftmax: lambda layer: nn.LogSoftmax(layer.dim),
}
