"""The neutral layer set, to declare your own model (see docs/user-models.md)::

from polytrain import ModelSpec
from polytrain.layers import Flatten, Linear, ReLU, seq

spec = ModelSpec("tiny", seq(("flatten", Flatten()), ("fc", Linear(784, 10))))
"""

from __future__ import annotations

from polytrain.neutral.models import (
    GRU,
    LAYER_TYPES,
    LSTM,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    Linear,
    MaxPool2d,
    MultiHeadSelfAttention,
    ReLU,
    Residual,
    Sequential,
    seq,
)

__all__ = [
    "GRU",
    "LAYER_TYPES",
    "LSTM",
    "AvgPool2d",
    "BatchNorm2d",
    "Conv2d",
    "Dropout",
    "Flatten",
    "GlobalAvgPool2d",
    "Layer",
    "Linear",
    "MaxPool2d",
    "MultiHeadSelfAttention",
    "ReLU",
    "Residual",
    "Sequential",
    "seq",
]
