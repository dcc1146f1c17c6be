"""torch's own nn.LSTM / nn.GRU for the recurrent layers: their state-dict names, layouts
and gate order are the canonical ones by definition."""

from __future__ import annotations

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


def build_recurrent_layer(layer: models.Layer) -> nn.Module | None:
    """The module of an LSTM or GRU spec layer, or None for another kind."""
    if isinstance(layer, models.RecurrentLayer):
        cls = LSTM if isinstance(layer, models.LSTM) else GRU
        return cls(layer.input_size, layer.hidden_size, layer.num_layers, batch_first=True)
    return None
