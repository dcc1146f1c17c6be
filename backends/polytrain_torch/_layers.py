"""torch.nn modules for the neutral specs: PyTorch's conventions are the canonical ones, so
every layer is torch's own, named as in the spec."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from polytrain.errors import BackendError
from polytrain.neutral import dropout_masks, models

from ._layout import Flatten
from ._rnn_layers import RECURRENT_BUILDERS
from ._seq_layers import SEQUENCE_BUILDERS, Add


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


def _build_residual(layer: models.Residual) -> nn.Module:
    short = None if layer.shortcut is None else build(layer.shortcut)
    return _Residual(build(layer.body), short)


def _build_add(layer: models.Add) -> nn.Module:
    return Add([build(branch) for branch in layer.branches])


def _build_conv2d(layer: models.Conv2d) -> nn.Module:
    return nn.Conv2d(
        layer.in_channels,
        layer.out_channels,
        layer.kernel_size,
        stride=layer.stride,
        padding=layer.padding,
        bias=layer.bias,
    )


def _build_linear(layer: models.Linear) -> nn.Module:
    return nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)


def _build_batch_norm_2d(layer: models.BatchNorm2d) -> nn.Module:
    return nn.BatchNorm2d(layer.num_features, eps=layer.eps, momentum=layer.momentum)


def _build_max_pool_2d(layer: models.MaxPool2d) -> nn.Module:
    return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding)


def _build_avg_pool_2d(layer: models.AvgPool2d) -> nn.Module:
    return nn.AvgPool2d(
        layer.kernel_size,
        layer.stride,
        layer.padding,
        ceil_mode=layer.ceil_mode,
        count_include_pad=layer.count_include_pad,
    )


#: every spec layer type's builder: the layer -> its torch module
BUILDERS: dict[type, Callable[[Any], nn.Module]] = {
    models.Sequential: _build_sequential,
    models.Residual: _build_residual,
    models.Add: _build_add,
    models.Conv2d: _build_conv2d,
    models.Linear: _build_linear,
    models.BatchNorm2d: _build_batch_norm_2d,
    models.ReLU: lambda _: nn.ReLU(),
    models.MaxPool2d: _build_max_pool_2d,
    models.AvgPool2d: _build_avg_pool_2d,
    models.GlobalAvgPool2d: lambda _: nn.AdaptiveAvgPool2d(1),
    models.Flatten: lambda _: Flatten(),  # nn.Flatten, gradients kept channels-last
    models.Dropout: lambda layer: _Dropout(layer.p),
    models.MultiHeadSelfAttention: _SelfAttention,
    **SEQUENCE_BUILDERS,
    **RECURRENT_BUILDERS,
}


def build(layer: models.Layer) -> nn.Module:
    """The module of ``layer``: the builder of its type (or nearest base) in :data:`BUILDERS`."""
    builder = next((BUILDERS[t] for t in type(layer).__mro__ if t in BUILDERS), None)
    if builder is None:
        raise BackendError(f"torch backend cannot build layer {layer!r}")
    return builder(layer)


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside DataParallel/DDP wrappers (no ``module.`` prefixes)."""
    while isinstance(module, nn.DataParallel | nn.parallel.DistributedDataParallel):
        module = module.module
    return module
