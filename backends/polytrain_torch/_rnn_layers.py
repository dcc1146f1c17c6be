"""torch's own nn.LSTM / nn.GRU for the recurrent layers: their state-dict names, layouts
and gate order are the canonical ones by definition."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from polytrain.neutral import models


class LSTM(nn.LSTM):
    """nn.LSTM with ``batch_first=True`` from a zero state, returning the output sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)[0]


class GRU(nn.GRU):
    """nn.GRU with ``batch_first=True`` from a zero state, returning the output sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)[0]


def _recurrent(cls: type[LSTM | GRU]) -> Callable[[Any], nn.Module]:
    """The builder of a ``cls`` module (batch first) from its spec layer."""

    def build(layer: models.LSTM | models.GRU) -> nn.Module:
        return cls(layer.input_size, layer.hidden_size, layer.num_layers, batch_first=True)

    return build


#: the recurrent layers' builders
RECURRENT_BUILDERS: dict[type, Callable[[Any], nn.Module]] = {
    models.LSTM: _recurrent(LSTM),
    models.GRU: _recurrent(GRU),
}
