"""torch.nn modules for the sequence and transformer layers: torch's own where it has one
(its names and layouts are the canonical ones), small modules otherwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from polytrain.neutral import models


class Add(nn.Module):
    """The element-wise sum of the branches (``branches.<i>``) on one input."""

    def __init__(self, branches: list[nn.Module]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total


class Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


class Transpose(nn.Module):
    def __init__(self, dim0: int, dim1: int) -> None:
        super().__init__()
        self.dims = (dim0, dim1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(*self.dims)


class Mean(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=self.dim)


class PositionalEmbedding(nn.Module):
    """``x + weight[:T]`` for x [N, T, E]; weight [max_len, E]."""

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight[: x.shape[1]]


def _conv1d(layer: models.Conv1d) -> nn.Module:
    return nn.Conv1d(
        layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride,
        padding=layer.padding, bias=layer.bias,
    )  # fmt: skip


def _batch_norm_1d(layer: models.BatchNorm1d) -> nn.Module:
    return nn.BatchNorm1d(layer.num_features, eps=layer.eps, momentum=layer.momentum)


def _layer_norm(layer: models.LayerNorm) -> nn.Module:
    return nn.LayerNorm(
        layer.normalized_shape, eps=layer.eps, elementwise_affine=layer.elementwise_affine
    )


def _embedding(layer: models.Embedding) -> nn.Module:
    return nn.Embedding(layer.num_embeddings, layer.embedding_dim)


def _positional_embedding(layer: models.PositionalEmbedding) -> nn.Module:
    return PositionalEmbedding(layer.max_len, layer.embedding_dim)


def _gelu(layer: models.GELU) -> nn.Module:
    return nn.GELU(approximate=layer.approximate)


#: the leaf sequence/transformer layers' builders (``Add``, a container, is _layers')
SEQUENCE_BUILDERS: dict[type, Callable[[Any], nn.Module]] = {
    models.Reshape: lambda layer: Reshape(layer.shape),
    models.Transpose: lambda layer: Transpose(layer.dim0, layer.dim1),
    models.Mean: lambda layer: Mean(layer.dim),
    models.Conv1d: _conv1d,
    models.BatchNorm1d: _batch_norm_1d,
    models.LayerNorm: _layer_norm,
    models.Embedding: _embedding,
    models.PositionalEmbedding: _positional_embedding,
    models.GELU: _gelu,
    models.SiLU: lambda _: nn.SiLU(),
    models.Tanh: lambda _: nn.Tanh(),
    models.Sigmoid: lambda _: nn.Sigmoid(),
    models.Softmax: lambda layer: nn.Softmax(layer.dim),
    models.LogSoftmax: lambda layer: nn.LogSoftmax(layer.dim),
}
