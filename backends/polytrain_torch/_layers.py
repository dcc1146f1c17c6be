"""torch.nn modules for the neutral specs: PyTorch's conventions are the canonical ones, so
every layer is torch's own, named as in the spec."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from polytrain.errors import BackendError
from polytrain.neutral import dropout_masks, models

from ._layout import Flatten
from ._rnn_layers import build_recurrent_layer
from ._seq_layers import build_sequence_layer


class _Residual(nn.Module):
    def __init__(self, body: nn.Module, shortcut: nn.Module | None) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x if self.shortcut is None else self.shortcut(x)
        return F.relu(self.body(x) + s, inplace=True)  # the sum is a fresh tensor


class _SelfAttention(nn.MultiheadAttention):
    """torch's own nn.MultiheadAttention (batch_first, no dropout) called as
    self-attention, with the causal mask when the spec asks: its state-dict names and
    layout are the canonical ones by definition."""

    def __init__(self, layer: models.MultiHeadSelfAttention) -> None:
        super().__init__(layer.embed_dim, layer.num_heads, bias=layer.bias, batch_first=True)
        self.causal = layer.causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        t = x.shape[1]
        mask = None
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        return super().forward(x, x, x, attn_mask=mask, need_weights=False)[0]


class _Dropout(nn.Dropout):
    """nn.Dropout, whose training mask comes from numpy while a parity step is open
    (``dropout_masks="parity"``, polytrain.neutral.dropout_masks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = _parity_mask(x, self.p) if self.training and self.p > 0 else None
        return super().forward(x) if mask is None else x * mask


@torch.compiler.disable  # numpy's generator, run as it is (never traced into a graph)
def _parity_mask(x: torch.Tensor, p: float) -> torch.Tensor | None:
    mask = dropout_masks.parity_mask(tuple(x.shape), p, str(x.dtype).removeprefix("torch."))
    return None if mask is None else torch.from_numpy(mask).to(x.device)


#: layers whose output is a fresh tensor that their backward does not read: a ReLU right
#: after one may overwrite it (docs/performance.md, "In-place ReLU and gradient layouts (torch)")
_FRESH_OUTPUT = (models.Conv2d, models.Linear, models.BatchNorm2d)


def _build_sequential(layer: models.Sequential) -> nn.Sequential:
    """The children in order; a ReLU after a :data:`_FRESH_OUTPUT` layer runs in place."""
    modules: OrderedDict[str, nn.Module] = OrderedDict()
    previous: models.Layer | None = None
    for name, child in layer.layers:
        if isinstance(child, models.ReLU) and isinstance(previous, _FRESH_OUTPUT):
            modules[name] = nn.ReLU(inplace=True)
        else:
            modules[name] = build(child)
        previous = child
    return nn.Sequential(modules)


def build(layer: models.Layer) -> nn.Module:
    if isinstance(layer, models.Sequential):
        return _build_sequential(layer)
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
        return Flatten()  # nn.Flatten, gradients kept channels-last
    if isinstance(layer, models.Dropout):
        return _Dropout(layer.p)
    if isinstance(layer, models.MultiHeadSelfAttention):
        return _SelfAttention(layer)
    module = build_sequence_layer(layer, build)
    if module is None:
        module = build_recurrent_layer(layer)
    if module is not None:
        return module
    raise BackendError(f"torch backend cannot build layer {layer!r}")


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside DataParallel/DDP wrappers (no ``module.`` prefixes)."""
    while isinstance(module, nn.DataParallel | nn.parallel.DistributedDataParallel):
        module = module.module
    return module
