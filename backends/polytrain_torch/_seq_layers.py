"""torch.nn modules for the sequence and transformer layers: torch's own where it has one
(its names and layouts are the canonical ones), small modules otherwise."""

from __future__ import annotations

from collections.abc import Callable

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


def build_sequence_layer(
    layer: models.Layer, build: Callable[[models.Layer], nn.Module]
) -> nn.Module | None:
    """The module of a sequence/transformer layer, or None for another kind."""
    if isinstance(layer, models.Add):
        return Add([build(branch) for branch in layer.branches])
    if isinstance(layer, models.Reshape):
        return Reshape(layer.shape)
    if isinstance(layer, models.Transpose):
        return Transpose(layer.dim0, layer.dim1)
    if isinstance(layer, models.Mean):
        return Mean(layer.dim)
    if isinstance(layer, models.Conv1d):
        return nn.Conv1d(
            layer.in_channels, layer.out_channels, layer.kernel_size, stride=layer.stride,
            padding=layer.padding, bias=layer.bias,
        )  # fmt: skip
    if isinstance(layer, models.BatchNorm1d):
        return nn.BatchNorm1d(layer.num_features, eps=layer.eps, momentum=layer.momentum)
    if isinstance(layer, models.LayerNorm):
        return nn.LayerNorm(
            layer.normalized_shape, eps=layer.eps, elementwise_affine=layer.elementwise_affine
        )
    if isinstance(layer, models.Embedding):
        return nn.Embedding(layer.num_embeddings, layer.embedding_dim)
    if isinstance(layer, models.PositionalEmbedding):
        return PositionalEmbedding(layer.max_len, layer.embedding_dim)
    return _activation(layer)


def _activation(layer: models.Layer) -> nn.Module | None:
    if isinstance(layer, models.GELU):
        return nn.GELU(approximate=layer.approximate)
    if isinstance(layer, models.SiLU):
        return nn.SiLU()
    if isinstance(layer, models.Tanh):
        return nn.Tanh()
    if isinstance(layer, models.Sigmoid):
        return nn.Sigmoid()
    if isinstance(layer, models.Softmax):
        return nn.Softmax(layer.dim)
    if isinstance(layer, models.LogSoftmax):
        return nn.LogSoftmax(layer.dim)
    return None
