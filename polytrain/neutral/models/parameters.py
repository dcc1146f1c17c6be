"""The canonical parameters of a layer: names and shapes in PyTorch's layout, the buffers
(BatchNorm's running statistics) among them, and the fans the init rules scale by."""

from __future__ import annotations

from polytrain.errors import ConfigError
from polytrain.neutral.models.layers import (
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    Embedding,
    Layer,
    LayerNorm,
    Linear,
    MultiHeadSelfAttention,
    PositionalEmbedding,
)
from polytrain.neutral.recurrent import RecurrentLayer, recurrent_parameters

BUFFER_SUFFIXES = (".running_mean", ".running_var")


def is_buffer(name: str) -> bool:
    """True for BatchNorm running statistics (state that is not trained)."""
    return name.endswith(BUFFER_SUFFIXES)


def layer_parameters(layer: Layer) -> dict[str, tuple[int, ...]]:
    """Canonical parameter shapes of one leaf layer (PyTorch layout)."""
    if isinstance(layer, Conv2d):
        k = layer.kernel_size
        shapes: dict[str, tuple[int, ...]] = {
            "weight": (layer.out_channels, layer.in_channels, k, k)
        }
        if layer.bias:
            shapes["bias"] = (layer.out_channels,)
        return shapes
    if isinstance(layer, Linear):
        shapes = {"weight": (layer.out_features, layer.in_features)}
        if layer.bias:
            shapes["bias"] = (layer.out_features,)
        return shapes
    if isinstance(layer, BatchNorm2d | BatchNorm1d):
        c = (layer.num_features,)
        return {"weight": c, "bias": c, "running_mean": c, "running_var": c}
    if isinstance(layer, MultiHeadSelfAttention):
        return _attention_parameters(layer)
    if isinstance(layer, RecurrentLayer):
        return recurrent_parameters(layer)
    return _sequence_layer_parameters(layer)


def _attention_parameters(layer: MultiHeadSelfAttention) -> dict[str, tuple[int, ...]]:
    """nn.MultiheadAttention's state-dict entries, in its order."""
    e = layer.embed_dim
    shapes: dict[str, tuple[int, ...]] = {"in_proj_weight": (3 * e, e)}
    if layer.bias:
        shapes["in_proj_bias"] = (3 * e,)
    shapes["out_proj.weight"] = (e, e)
    if layer.bias:
        shapes["out_proj.bias"] = (e,)
    return shapes


def _sequence_layer_parameters(layer: Layer) -> dict[str, tuple[int, ...]]:
    if isinstance(layer, Conv1d):
        shapes: dict[str, tuple[int, ...]] = {
            "weight": (layer.out_channels, layer.in_channels, layer.kernel_size)
        }
        if layer.bias:
            shapes["bias"] = (layer.out_channels,)
        return shapes
    if isinstance(layer, LayerNorm):
        shape = layer.normalized_shape
        return {"weight": shape, "bias": shape} if layer.elementwise_affine else {}
    if isinstance(layer, Embedding):
        return {"weight": (layer.num_embeddings, layer.embedding_dim)}
    if isinstance(layer, PositionalEmbedding):
        return {"weight": (layer.max_len, layer.embedding_dim)}
    return {}


def fans(layer: Layer) -> tuple[int, int]:
    """(fan in, fan out) of a convolution or linear layer's weight."""
    if isinstance(layer, Conv2d):
        area = layer.kernel_size**2
        return layer.in_channels * area, layer.out_channels * area
    if isinstance(layer, Linear):
        return layer.in_features, layer.out_features
    if isinstance(layer, Conv1d):
        k = layer.kernel_size
        return layer.in_channels * k, layer.out_channels * k
    raise ConfigError(f"No fan for {layer!r}")
