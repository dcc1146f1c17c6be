"""torch.nn modules for the neutral specs: PyTorch's conventions are the canonical ones, so
every layer is torch's own, named as in the spec."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from polytrain.errors import BackendError
from polytrain.neutral import models


class _Residual(nn.Module):
    def __init__(self, body: nn.Module, shortcut: nn.Module | None) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.body(x) + s)


def build(layer: models.Layer) -> nn.Module:
    if isinstance(layer, models.Sequential):
        return nn.Sequential(OrderedDict((n, build(c)) for n, c in layer.layers))
    if isinstance(layer, models.Residual):
        short = None if layer.shortcut is None else build(layer.shortcut)
        return _Residual(build(layer.body), short)
    if isinstance(layer, models.Conv2d):
        return nn.Conv2d(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size,
            stride=layer.stride,
            padding=layer.padding,
            bias=layer.bias,
        )
    if isinstance(layer, models.Linear):
        return nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
    if isinstance(layer, models.BatchNorm2d):
        return nn.BatchNorm2d(layer.num_features, eps=layer.eps, momentum=layer.momentum)
    if isinstance(layer, models.ReLU):
        return nn.ReLU()
    if isinstance(layer, models.MaxPool2d):
        return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding)
    if isinstance(layer, models.AvgPool2d):
        return nn.AvgPool2d(
            layer.kernel_size,
            layer.stride,
            layer.padding,
            ceil_mode=layer.ceil_mode,
            count_include_pad=layer.count_include_pad,
        )
    if isinstance(layer, models.GlobalAvgPool2d):
        return nn.AdaptiveAvgPool2d(1)
    if isinstance(layer, models.Flatten):
        return nn.Flatten()
    if isinstance(layer, models.Dropout):
        return nn.Dropout(layer.p)
    raise BackendError(f"torch backend cannot build layer {layer!r}")


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside DataParallel/DDP wrappers (no ``module.`` prefixes)."""
    while isinstance(module, nn.DataParallel | nn.parallel.DistributedDataParallel):
        module = module.module
    return module
