"""Gluon blocks for the sequence and transformer layers, with PyTorch's numbers. Norm
layers keep Gluon's ``gamma``/``beta`` (renamed to weight/bias like BatchNorm's); GELU is
written from ``erf``/``tanh`` so both of PyTorch's forms are exact."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mxnet.gluon import nn

from polytrain.neutral import models


class _Branches(nn.HybridBlock):
    def __init__(self, branches: list[nn.HybridBlock]) -> None:
        super().__init__()
        for i, block in enumerate(branches):
            self.register_child(block, str(i))


class Add(nn.HybridBlock):
    """The element-wise sum of the branches (``branches.<i>``) on one input."""

    def __init__(self, branches: list[nn.HybridBlock]) -> None:
        super().__init__()
        self.branches = _Branches(branches)

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        outs = [branch(x) for branch in self.branches._children.values()]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total


class Reshape(nn.HybridBlock):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self._shape = (0, *shape)

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return F.reshape(x, shape=self._shape)


class Transpose(nn.HybridBlock):
    def __init__(self, dim0: int, dim1: int) -> None:
        super().__init__()
        self._dims = (dim0, dim1)

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return F.swapaxes(x, dim1=self._dims[0], dim2=self._dims[1])


class Mean(nn.HybridBlock):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self._dim = dim

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return F.mean(x, axis=self._dim)


class LayerNorm(nn.HybridBlock):
    """Normalise over the last dims (Gluon's LayerNorm takes one axis only)."""

    def __init__(self, layer: models.LayerNorm) -> None:
        super().__init__()
        self._axes = tuple(range(-len(layer.normalized_shape), 0))
        self._eps, self._affine = layer.eps, layer.elementwise_affine
        if self._affine:
            shape = layer.normalized_shape
            self.gamma = self.params.get("gamma", shape=shape, init="ones")
            self.beta = self.params.get("beta", shape=shape, init="zeros")

    def hybrid_forward(self, F: Any, x: Any, gamma: Any = None, beta: Any = None) -> Any:
        centered = F.broadcast_sub(x, F.mean(x, axis=self._axes, keepdims=True))
        var = F.mean(centered * centered, axis=self._axes, keepdims=True)
        y = F.broadcast_div(centered, F.sqrt(var + self._eps))
        if not self._affine:
            return y
        return F.broadcast_add(F.broadcast_mul(y, gamma), beta)


class PositionalEmbedding(nn.HybridBlock):
    """``x + weight[:T]`` for x [N, T, E]; weight [max_len, E]."""

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.weight = self.params.get("weight", shape=(max_len, dim))

    def hybrid_forward(self, F: Any, x: Any, weight: Any) -> Any:
        positions = F.slice_like(F.expand_dims(weight, axis=0), x, axes=(1,))
        return F.broadcast_add(x, positions)


def _erf(F: Any, z: Any) -> Any:
    """``erf(z)`` whose gradient is 2/sqrt(pi) exp(-z^2) in the input's precision (MXNet
    1.9's erf backward is float32-accurate: 6e-7 relative off in float64 models). The
    added ``z*d - stop(z*d)`` is exactly 0 and carries the gradient ``d``."""
    d = F.BlockGrad(2.0 / math.sqrt(math.pi) * F.exp(-z * z))
    slope = z * d
    return F.BlockGrad(F.erf(z)) + slope - F.BlockGrad(slope)


class Activation(nn.HybridBlock):
    """GELU (erf or tanh form), SiLU, Softmax and LogSoftmax along ``dim``."""

    def __init__(self, layer: models.Layer) -> None:
        super().__init__()
        self._layer = layer

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        layer = self._layer
        if isinstance(layer, models.GELU) and layer.approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
            return 0.5 * x * (1.0 + F.tanh(inner))
        if isinstance(layer, models.GELU):
            return 0.5 * x * (1.0 + _erf(F, x / math.sqrt(2.0)))
        if isinstance(layer, models.SiLU):
            return x * F.sigmoid(x)
        if isinstance(layer, models.Softmax):
            return F.softmax(x, axis=layer.dim)
        assert isinstance(layer, models.LogSoftmax)
        return F.log_softmax(x, axis=layer.dim)


def _conv1d(layer: models.Conv1d) -> nn.HybridBlock:
    return nn.Conv1D(
        layer.out_channels, layer.kernel_size, strides=layer.stride, padding=layer.padding,
        in_channels=layer.in_channels, use_bias=layer.bias,
    )  # fmt: skip


def _embedding(layer: models.Embedding) -> nn.HybridBlock:
    return nn.Embedding(layer.num_embeddings, layer.embedding_dim)


def _positional_embedding(layer: models.PositionalEmbedding) -> nn.HybridBlock:
    return PositionalEmbedding(layer.max_len, layer.embedding_dim)


#: the leaf sequence/transformer layers' builders (``Add``, a container, and
#: ``BatchNorm1d``, on _layers' BatchNorm, are _layers')
SEQUENCE_BUILDERS: dict[type, Callable[[Any], nn.HybridBlock]] = {
    models.Reshape: lambda layer: Reshape(layer.shape),
    models.Transpose: lambda layer: Transpose(layer.dim0, layer.dim1),
    models.Mean: lambda layer: Mean(layer.dim),
    models.Conv1d: _conv1d,
    models.LayerNorm: LayerNorm,
    models.Embedding: _embedding,
    models.PositionalEmbedding: _positional_embedding,
    models.Tanh: lambda _: nn.Activation("tanh"),
    models.Sigmoid: lambda _: nn.Activation("sigmoid"),
    models.GELU: Activation,
    models.SiLU: Activation,
    models.Softmax: Activation,
    models.LogSoftmax: Activation,
}
