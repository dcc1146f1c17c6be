"""The neutral layer set, to declare your own model (see docs/user-models.md)::

from polytrain import ModelSpec
from polytrain.layers import Flatten, Linear, ReLU, seq

spec = ModelSpec("tiny", seq(("flatten", Flatten()), ("fc", Linear(784, 10))))

Every layer type of :data:`LAYER_TYPES` is here (a test checks it).
"""

from __future__ import annotations

from polytrain.neutral.models.layers import (
    GELU,
    GRU,
    LAYER_TYPES,
    LSTM,
    Add,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GlobalAvgPool2d,
    Layer,
    LayerNorm,
    Linear,
    LogSoftmax,
    MaxPool2d,
    Mean,
    MultiHeadSelfAttention,
    PositionalEmbedding,
    ReLU,
    Reshape,
    Residual,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
    Transpose,
    seq,
)

__all__ = [
    "GELU",
    "GRU",
    "LAYER_TYPES",
    "LSTM",
    "Add",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GlobalAvgPool2d",
    "Layer",
    "LayerNorm",
    "Linear",
    "LogSoftmax",
    "MaxPool2d",
    "Mean",
    "MultiHeadSelfAttention",
    "PositionalEmbedding",
    "ReLU",
    "Reshape",
    "Residual",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "Transpose",
    "seq",
]
