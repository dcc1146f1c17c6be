"""The neutral layer set: small frozen records that describe a layer, each of which every
backend builds natively (docs/user-models.md lists them, generated from these classes by
:mod:`polytrain.neutral.layer_docs`). A model's net is a tree of them under named
:class:`Sequential` levels; :func:`walk` yields its leaves with their dotted paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from polytrain.errors import ConfigError
from polytrain.neutral.recurrent import GRU, LSTM  # the recurrent layers live there

__all__ = [  # the public layer set: polytrain.layers and polytrain.neutral.models serve it
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


@dataclass(frozen=True)
class Conv2d:
    """Cross-correlation over [N, C, H, W] (PyTorch's Conv2d; weight [out, in, k, k])."""

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0
    bias: bool = True


@dataclass(frozen=True)
class Linear:
    """``x @ weight.T + bias`` over the last axis (weight [out, in], PyTorch's layout)."""

    in_features: int
    out_features: int
    bias: bool = True


@dataclass(frozen=True)
class BatchNorm2d:
    """BatchNorm with PyTorch's conventions: ``momentum`` weights the *new* statistic,
    running_var is the unbiased estimate."""

    num_features: int
    eps: float = 1e-5
    momentum: float = 0.1


@dataclass(frozen=True)
class ReLU:
    """``max(x, 0)``, any shape."""


@dataclass(frozen=True)
class MaxPool2d:
    """The maximum of each window over [N, C, H, W] (``stride`` None: the window)."""

    kernel_size: int
    stride: int | None = None
    padding: int = 0


@dataclass(frozen=True)
class AvgPool2d:
    """Average pooling; ``count_include_pad=True`` (PyTorch's and MXNet's default)."""

    kernel_size: int
    stride: int | None = None
    padding: int = 0
    ceil_mode: bool = False
    count_include_pad: bool = True


@dataclass(frozen=True)
class GlobalAvgPool2d:
    """The mean over H and W: [N, C, H, W] -> [N, C]."""


@dataclass(frozen=True)
class Flatten:
    """Every axis but the batch as one: [N, ...] -> [N, prod(...)]."""


@dataclass(frozen=True)
class Dropout:
    """Zeroes each value with probability ``p`` while training and scales the rest by
    1 / (1 - p); the identity in evaluation (the masks: docs/semantics.md)."""

    p: float = 0.5


@dataclass(frozen=True)
class Sequential:
    """Named layers applied in order; nest it to group layers (``block.conv1.weight``)."""

    layers: tuple[tuple[str, Layer], ...]


@dataclass(frozen=True)
class Residual:
    """``relu(body(x) + shortcut(x))``; no shortcut means identity."""

    body: Sequential
    shortcut: Sequential | None = None


# -- sequence and transformer layers (issue 15) ----------------------------------------------


@dataclass(frozen=True)
class Conv1d:
    """Cross-correlation over [N, C, L] (PyTorch's Conv1d; weight [out, in, k])."""

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0
    bias: bool = True


@dataclass(frozen=True)
class BatchNorm1d:
    """BatchNorm over [N, C] or [N, C, L], with BatchNorm2d's (PyTorch's) conventions."""

    num_features: int
    eps: float = 1e-5
    momentum: float = 0.1


@dataclass(frozen=True)
class LayerNorm:
    """Normalise over the last ``len(normalized_shape)`` dims (biased variance, ``eps``
    inside the square root); ``elementwise_affine``: a weight (1) and bias (0) of that shape."""

    normalized_shape: tuple[int, ...]
    eps: float = 1e-5
    elementwise_affine: bool = True

    def __post_init__(self) -> None:
        shape = self.normalized_shape
        dims = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
        object.__setattr__(self, "normalized_shape", dims)


@dataclass(frozen=True)
class Embedding:
    """Integer ids [N, ...] -> rows of ``weight`` [num_embeddings, embedding_dim]
    (initialised N(0, 1) as PyTorch does; N(0, init_std) under the ``normal`` rule)."""

    num_embeddings: int
    embedding_dim: int


@dataclass(frozen=True)
class PositionalEmbedding:
    """Learned positions: ``x + weight[:T]`` for x [N, T, E], weight [max_len, E]
    (initialised N(0, 0.02), as ViT and GPT-2 do)."""

    max_len: int
    embedding_dim: int


@dataclass(frozen=True)
class GELU:
    """``x * Phi(x)``: ``approximate="none"`` the exact erf form, ``"tanh"`` the tanh one."""

    approximate: str = "none"

    def __post_init__(self) -> None:
        if self.approximate not in ("none", "tanh"):
            raise ConfigError(
                f"GELU approximate must be 'none' or 'tanh', not {self.approximate!r}."
            )


@dataclass(frozen=True)
class SiLU:
    """``x * sigmoid(x)``, any shape."""


@dataclass(frozen=True)
class Tanh:
    """``tanh(x)``, any shape."""


@dataclass(frozen=True)
class Sigmoid:
    """``1 / (1 + exp(-x))``, any shape."""


@dataclass(frozen=True)
class Softmax:
    """Softmax along ``dim`` (an axis of the whole tensor, batch included; -1: the last)."""

    dim: int = -1


@dataclass(frozen=True)
class LogSoftmax:
    """``log(softmax(x))`` along ``dim``, computed stably."""

    dim: int = -1


@dataclass(frozen=True)
class Reshape:
    """Each sample to ``shape`` (the batch axis kept), e.g. [N, 12] -> [N, 3, 4]."""

    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))


@dataclass(frozen=True)
class Transpose:
    """Swap axes ``dim0`` and ``dim1`` of the whole tensor (negative: from the end); the
    batch axis 0 stays, e.g. ``Transpose(1, 2)``: [N, E, T] -> [N, T, E]."""

    dim0: int
    dim1: int

    def __post_init__(self) -> None:
        if 0 in (self.dim0, self.dim1):
            raise ConfigError(
                f"Transpose({self.dim0}, {self.dim1}): the batch axis 0 cannot move; name "
                "axes >= 1 (or negative, from the end)."
            )


@dataclass(frozen=True)
class Mean:
    """The mean over axis ``dim`` (of the whole tensor, negative: from the end; not the batch
    axis), which is dropped: ``Mean(1)`` on tokens [N, T, E] is the global average pool of
    a ViT's tokens, [N, E]."""

    dim: int = 1

    def __post_init__(self) -> None:
        if self.dim == 0:
            raise ConfigError("Mean(0) would average the batch: name an axis >= 1 or < 0.")


@dataclass(frozen=True)
class Add:
    """Element-wise sum of every branch applied to the same input; an empty Sequential is
    the identity, so ``Add((seq(), seq(("ln", ...), ("attn", ...))))`` is a pre-norm
    residual. Parameters are named ``branches.<i>.<layer>...``."""

    branches: tuple[Sequential, ...]


@dataclass(frozen=True)
class MultiHeadSelfAttention:
    """Self-attention on [N, T, E] (PyTorch's ``nn.MultiheadAttention`` with
    ``batch_first=True`` and query = key = value): scaled dot product per head, optional
    causal mask (position t sees positions <= t), no dropout. Canonical parameters are
    torch's: ``in_proj_weight`` [3E, E] (q, k, v rows), ``in_proj_bias`` [3E],
    ``out_proj.weight`` [E, E], ``out_proj.bias`` [E] (biases only with ``bias``)."""

    embed_dim: int
    num_heads: int
    causal: bool = False
    bias: bool = True

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.embed_dim % self.num_heads:
            raise ConfigError(
                f"MultiHeadSelfAttention: embed_dim {self.embed_dim} must be a multiple of "
                f"num_heads {self.num_heads} (>= 1)."
            )


SequenceLayer = (
    Conv1d
    | BatchNorm1d
    | LayerNorm
    | Embedding
    | PositionalEmbedding
    | GELU
    | SiLU
    | Tanh
    | Sigmoid
    | Softmax
    | LogSoftmax
    | Reshape
    | Transpose
    | Mean
    | Add
)
Layer = (
    Conv2d
    | Linear
    | BatchNorm2d
    | ReLU
    | MaxPool2d
    | AvgPool2d
    | GlobalAvgPool2d
    | Flatten
    | Dropout
    | Sequential
    | Residual
    | SequenceLayer
    | MultiHeadSelfAttention
    | LSTM
    | GRU
)
LAYER_TYPES: dict[str, type] = {
    t.__name__: t
    for t in (
        Conv2d, Linear, BatchNorm2d, ReLU, MaxPool2d, AvgPool2d, GlobalAvgPool2d, Flatten,
        Dropout, Sequential, Residual, Conv1d, BatchNorm1d, LayerNorm, Embedding,
        PositionalEmbedding, GELU, SiLU, Tanh, Sigmoid, Softmax, LogSoftmax, Reshape, Add,
        Transpose, Mean, MultiHeadSelfAttention, LSTM, GRU,
    )
}  # fmt: skip


def seq(*layers: tuple[str, Layer]) -> Sequential:
    """``Sequential`` of ``(name, layer)`` pairs."""
    return Sequential(tuple(layers))


def walk(layer: Layer, prefix: str) -> Iterator[tuple[str, Layer]]:
    """Leaf layers under ``layer`` with dotted paths."""
    if isinstance(layer, Sequential):
        for name, child in layer.layers:
            yield from walk(child, f"{prefix}.{name}" if prefix else name)
    elif isinstance(layer, Residual):
        yield from walk(layer.body, f"{prefix}.body" if prefix else "body")
        if layer.shortcut is not None:
            yield from walk(layer.shortcut, f"{prefix}.shortcut" if prefix else "shortcut")
    elif isinstance(layer, Add):
        for i, branch in enumerate(layer.branches):
            yield from walk(branch, f"{prefix}.branches.{i}" if prefix else f"branches.{i}")
    else:
        yield prefix, layer
