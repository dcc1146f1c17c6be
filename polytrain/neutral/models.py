"""Neutral model specs: a framework-free description each backend builds natively.

A spec is a tree of small frozen layer records with names; canonical parameter names
are the dotted paths (``conv1.weight``, ``stages.0.0.bn1.running_var``), in PyTorch's
layout. Initial weights are drawn here, in numpy, from the seed, by the rule the spec names,
so every backend starts from the same numbers (the initialisation contract in
docs/architecture.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from polytrain.errors import ConfigError
from polytrain.neutral import spec_check
from polytrain.neutral.recurrent import (
    GRU,
    LSTM,
    RecurrentLayer,
    recurrent_init,
    recurrent_parameters,
)


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
_ALL_LAYERS: tuple[type, ...] = (Conv2d, Linear, BatchNorm2d, ReLU, MaxPool2d, AvgPool2d)
_ALL_LAYERS += (GlobalAvgPool2d, Flatten, Dropout, Sequential, Residual)
_ALL_LAYERS += (Conv1d, BatchNorm1d, LayerNorm, Embedding, PositionalEmbedding, GELU, SiLU)
_ALL_LAYERS += (Tanh, Sigmoid, Softmax, LogSoftmax, Reshape, Add)
_ALL_LAYERS += (Transpose, Mean)
_ALL_LAYERS += (MultiHeadSelfAttention,)
_ALL_LAYERS += (LSTM, GRU)
LAYER_TYPES: dict[str, type] = {t.__name__: t for t in _ALL_LAYERS}
INIT_RULES = ("torch_default", "xavier_uniform", "kaiming_normal", "normal")


@dataclass(frozen=True)
class ModelSpec:
    """A named network with its input shape and initialisation rule.

    ``init``: ``torch_default`` (PyTorch's Conv/Linear defaults), ``xavier_uniform``
    (biases zero), ``kaiming_normal`` (fan_out, relu; biases zero) or ``normal`` with
    ``init_std`` (d2l's scratch recipe; biases zero). BatchNorm starts at 1/0/0/1.
    """

    name: str
    net: Sequential
    input_shape: tuple[int, ...] = (1, 28, 28)  # of one sample, e.g. (C, H, W) or (features,)
    num_classes: int = 10  # outputs per sample: classes, or values of a regression
    init: str = "xavier_uniform"
    init_std: float = 0.01
    has_randomness: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        if self.init not in INIT_RULES:
            raise ConfigError(f"Unknown init rule {self.init!r}; use one of {INIT_RULES}.")
        shape = tuple(self.input_shape)
        if not shape or not all(isinstance(n, int) and n >= 1 for n in shape):
            raise ConfigError(f"input_shape must be sizes >= 1 of one sample, got {shape!r}.")
        object.__setattr__(self, "input_shape", shape)
        if isinstance(self.num_classes, bool) or not (
            isinstance(self.num_classes, int) and self.num_classes >= 1
        ):
            raise ConfigError(f"num_classes must be an integer >= 1, got {self.num_classes!r}.")
        if not isinstance(self.net, Sequential):
            raise ConfigError(f"A model spec's net must be a Sequential, got {self.net!r}.")
        if not (isinstance(self.init_std, int | float) and math.isfinite(self.init_std)):
            raise ConfigError(f"init_std must be a finite number, got {self.init_std!r}.")
        spec_check.check_tree(self.net, self.name)
        spec_check.check_memory(self.name, self.num_parameters())

    # -- walking ----------------------------------------------------------------------------

    def layers(self) -> Iterator[tuple[str, Layer]]:
        """Every leaf layer with its dotted path, in forward order."""
        yield from walk(self.net, "")

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical name -> shape of every parameter and buffer, in model order."""
        shapes: dict[str, tuple[int, ...]] = {}
        for path, layer in self.layers():
            for pname, shape in layer_parameters(layer).items():
                shapes[f"{path}.{pname}"] = shape
        return shapes

    def trainable_names(self) -> list[str]:
        return [n for n in self.parameter_shapes() if not is_buffer(n)]

    def num_parameters(self) -> int:
        return sum(math.prod(s) for n, s in self.parameter_shapes().items() if not is_buffer(n))

    # -- initialisation ---------------------------------------------------------------------

    def init_params(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Float32 initial weights from ``seed``: each tensor from its own generator
        seeded with (seed, its index), so adding a layer does not shift the others."""
        out: dict[str, np.ndarray] = {}
        index = 0
        for path, layer in self.layers():
            for pname, shape in layer_parameters(layer).items():
                rng = np.random.default_rng([seed, index])
                index += 1
                out[f"{path}.{pname}"] = self._init_one(layer, pname, shape, rng)
        return out

    def _init_one(
        self, layer: Layer, pname: str, shape: tuple[int, ...], rng: np.random.Generator
    ) -> np.ndarray:
        if isinstance(layer, BatchNorm2d | BatchNorm1d | LayerNorm):
            value = 1.0 if pname in ("weight", "running_var") else 0.0
            return np.full(shape, value, dtype=np.float32)
        if isinstance(layer, Embedding | PositionalEmbedding):
            std = 1.0 if isinstance(layer, Embedding) else 0.02
            std = self.init_std if self.init == "normal" else std
            return rng.normal(0.0, std, shape).astype(np.float32)
        if isinstance(layer, MultiHeadSelfAttention):
            return self._init_attention(pname, shape, rng)
        if isinstance(layer, RecurrentLayer):
            return recurrent_init(layer, shape, rng)
        fan_in, fan_out = _fans(layer)
        if pname == "bias":
            if self.init == "torch_default":
                bound = 1 / math.sqrt(fan_in)
                return rng.uniform(-bound, bound, shape).astype(np.float32)
            return np.zeros(shape, dtype=np.float32)
        if self.init == "torch_default":
            bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5))
            return rng.uniform(-bound, bound, shape).astype(np.float32)
        if self.init == "xavier_uniform":
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-bound, bound, shape).astype(np.float32)
        if self.init == "kaiming_normal":
            return rng.normal(0.0, math.sqrt(2.0 / fan_out), shape).astype(np.float32)
        return rng.normal(0.0, self.init_std, shape).astype(np.float32)

    def _init_attention(
        self, pname: str, shape: tuple[int, ...], rng: np.random.Generator
    ) -> np.ndarray:
        """PyTorch's nn.MultiheadAttention: biases zero; ``torch_default`` draws
        in_proj_weight xavier-uniform over [3E, E] and out_proj.weight as a Linear."""
        if len(shape) == 1:
            return np.zeros(shape, dtype=np.float32)
        fan_out, fan_in = shape
        if self.init == "torch_default":
            if pname == "in_proj_weight":
                bound = math.sqrt(6.0 / (fan_in + fan_out))
            else:
                bound = 1 / math.sqrt(fan_in)
            return rng.uniform(-bound, bound, shape).astype(np.float32)
        if self.init == "xavier_uniform":
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-bound, bound, shape).astype(np.float32)
        if self.init == "kaiming_normal":
            return rng.normal(0.0, math.sqrt(2.0 / fan_out), shape).astype(np.float32)
        return rng.normal(0.0, self.init_std, shape).astype(np.float32)

    # -- serialisation ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "net": _layer_to_dict(self.net),
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "init": self.init,
            "init_std": self.init_std,
            "has_randomness": self.has_randomness,
            "description": self.description,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        try:
            net = _layer_from_dict(_as_sequential(data["net"]))
            if not isinstance(net, Sequential):
                raise ConfigError("A model spec's 'net' must be a Sequential.")
            return cls(
                name=str(data["name"]),
                net=net,
                input_shape=tuple(data["input_shape"]),
                num_classes=data["num_classes"],
                init=str(data.get("init", "xavier_uniform")),
                init_std=data.get("init_std", 0.01),
                has_randomness=bool(data.get("has_randomness", False)),
                description=str(data.get("description", "")),
            )
        except ConfigError:
            raise
        except KeyError as exc:
            raise ConfigError(f"Not a valid model spec: it has no {exc} field.") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"Not a valid model spec: {exc}.") from exc


BUFFER_SUFFIXES = (".running_mean", ".running_var")


def is_buffer(name: str) -> bool:
    """True for BatchNorm running statistics (state that is not trained)."""
    return name.endswith(BUFFER_SUFFIXES)


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


def _fans(layer: Layer) -> tuple[int, int]:
    if isinstance(layer, Conv2d):
        area = layer.kernel_size**2
        return layer.in_channels * area, layer.out_channels * area
    if isinstance(layer, Linear):
        return layer.in_features, layer.out_features
    if isinstance(layer, Conv1d):
        k = layer.kernel_size
        return layer.in_channels * k, layer.out_channels * k
    raise ConfigError(f"No fan for {layer!r}")


def _layer_to_dict(layer: Layer) -> dict[str, Any]:
    if isinstance(layer, Sequential):
        return {"type": "Sequential", "layers": [[n, _layer_to_dict(c)] for n, c in layer.layers]}
    if isinstance(layer, Residual):
        return {
            "type": "Residual",
            "body": _layer_to_dict(layer.body),
            "shortcut": None if layer.shortcut is None else _layer_to_dict(layer.shortcut),
        }
    if isinstance(layer, Add):
        return {"type": "Add", "branches": [_layer_to_dict(b) for b in layer.branches]}
    return {"type": type(layer).__name__, **asdict(layer)}


def _as_sequential(data: Any) -> Any:
    """A bare list of layers is a Sequential (the short form of spec files)."""
    return {"type": "Sequential", "layers": data} if isinstance(data, list) else data


def _named_layer(entry: Any, depth: int) -> tuple[str, Layer]:
    """``[name, {type: ...}]`` or ``{name: ..., type: ...}`` (the file form)."""
    if isinstance(entry, dict):
        fields = dict(entry)
        if "name" not in fields:
            raise ConfigError(f"A layer entry has no 'name': {_short(entry)}.")
        name = str(fields.pop("name"))
        return name, _layer_from_dict(fields, depth + 1, name)
    if not isinstance(entry, list | tuple) or len(entry) != 2:
        raise ConfigError(f"A layer entry must be [name, layer] or a table: {_short(entry)}.")
    name, child = entry
    return str(name), _layer_from_dict(_as_sequential(child), depth + 1, str(name))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _layer_from_dict(data: dict[str, Any], depth: int = 0, name: str = "net") -> Layer:
    if not isinstance(data, dict):
        raise ConfigError(f"A layer must be a table/object with a 'type', got {_short(data)}.")
    if depth > spec_check.MAX_DEPTH:
        raise ConfigError(
            f"The model spec nests layers more than {spec_check.MAX_DEPTH} levels deep (at "
            f"{name!r}); flatten it into fewer Sequential levels."
        )
    kind = data.get("type")
    if kind == "Sequential":
        return Sequential(tuple(_named_layer(entry, depth) for entry in data["layers"]))
    if kind == "Residual":
        body = _layer_from_dict(_as_sequential(data["body"]), depth + 1, "body")
        short = data.get("shortcut")
        shortcut = (
            None if short is None else _layer_from_dict(_as_sequential(short), depth + 1, name)
        )
        if not isinstance(body, Sequential) or not (
            shortcut is None or isinstance(shortcut, Sequential)
        ):
            raise ConfigError("Residual body and shortcut must be Sequential.")
        return Residual(body, shortcut)
    if kind == "Add":
        branches = tuple(
            _layer_from_dict(_as_sequential(b), depth + 1, name) for b in data["branches"]
        )
        if not all(isinstance(b, Sequential) for b in branches):
            raise ConfigError("Add branches must be Sequential (or lists of layers).")
        return Add(branches)  # type: ignore[arg-type]
    if kind not in LAYER_TYPES:
        raise ConfigError(f"Unknown layer type {kind!r} in model spec.")
    fields = {k: v for k, v in data.items() if k != "type"}
    spec_check.check_fields(LAYER_TYPES[kind], fields, f"layer {name!r}")
    try:
        layer: Layer = LAYER_TYPES[kind](**fields)
    except TypeError as exc:
        raise ConfigError(f"Layer {kind}: {exc} (fields given: {sorted(fields)}).") from None
    return layer


def seq(*layers: tuple[str, Layer]) -> Sequential:
    return Sequential(tuple(layers))


# -- the built-in specs ----------------------------------------------------------------------


def lenet(init: str = "xavier_uniform") -> ModelSpec:
    """d2l's LeNet of the multi-GPU chapters: conv 1->20 k3, avgpool, conv 20->50 k5,
    avgpool, dense 800->128, dense 128->10, ReLU between."""
    return ModelSpec(
        "lenet",
        seq(
            ("conv1", Conv2d(1, 20, 3)),
            ("relu1", ReLU()),
            ("pool1", AvgPool2d(2, 2)),
            ("conv2", Conv2d(20, 50, 5)),
            ("relu2", ReLU()),
            ("pool2", AvgPool2d(2, 2)),
            ("flatten", Flatten()),
            ("fc1", Linear(800, 128)),
            ("relu3", ReLU()),
            ("fc2", Linear(128, 10)),
        ),
        init=init,
        description="d2l multi-GPU LeNet (1.3e5 parameters)",
    )


def lenet_scratch() -> ModelSpec:
    """The same LeNet with d2l's scratch initialisation N(0, 0.01), biases zero."""
    spec = lenet(init="normal")
    return ModelSpec(**{**spec.__dict__, "name": "lenet-scratch"})


def paddle_mnist() -> ModelSpec:
    """The Paddle MNIST tutorial's CNN: conv 20 k5 p2, maxpool, conv 20 k5 p2, maxpool,
    dense 980->10 (the tutorial's softmax is part of the loss here)."""
    return ModelSpec(
        "paddle-mnist",
        seq(
            ("conv1", Conv2d(1, 20, 5, padding=2)),
            ("relu1", ReLU()),
            ("pool1", MaxPool2d(2, 2)),
            ("conv2", Conv2d(20, 20, 5, padding=2)),
            ("relu2", ReLU()),
            ("pool2", MaxPool2d(2, 2)),
            ("flatten", Flatten()),
            ("fc", Linear(980, 10)),
        ),
        init="torch_default",
        description="Paddle MNIST tutorial CNN",
    )


def torch_dp_cnn() -> ModelSpec:
    """The PyTorch DataParallel tutorial's CNN: conv 64, conv 128, maxpool,
    dense 25088->1024, dropout 0.5, dense 10."""
    return ModelSpec(
        "torch-dp-cnn",
        seq(
            ("conv1", Conv2d(1, 64, 3, padding=1)),
            ("relu1", ReLU()),
            ("conv2", Conv2d(64, 128, 3, padding=1)),
            ("relu2", ReLU()),
            ("pool", MaxPool2d(2, 2)),
            ("flatten", Flatten()),
            ("fc1", Linear(14 * 14 * 128, 1024)),
            ("relu3", ReLU()),
            ("dropout", Dropout(0.5)),
            ("fc2", Linear(1024, 10)),
        ),
        init="torch_default",
        has_randomness=True,
        description="PyTorch DataParallel tutorial CNN (dropout: no cross-framework parity)",
    )


def mlp(hidden: int = 32) -> ModelSpec:
    """A small MLP (flatten, dense, relu, dense) whose gradients numpy checks exactly."""
    return ModelSpec(
        "mlp",
        seq(
            ("flatten", Flatten()),
            ("fc1", Linear(784, hidden)),
            ("relu1", ReLU()),
            ("fc2", Linear(hidden, 10)),
        ),
        init="xavier_uniform",
        description="two-layer perceptron",
    )


def _residual(cin: int, cout: int, stride: int) -> Residual:
    body = seq(
        ("conv1", Conv2d(cin, cout, 3, stride=stride, padding=1)),
        ("bn1", BatchNorm2d(cout)),
        ("relu", ReLU()),
        ("conv2", Conv2d(cout, cout, 3, padding=1)),
        ("bn2", BatchNorm2d(cout)),
    )
    shortcut = None
    if stride != 1 or cin != cout:
        shortcut = seq(("conv", Conv2d(cin, cout, 1, stride=stride)))
    return Residual(body, shortcut)


def resnet18(num_classes: int = 10, in_channels: int = 1) -> ModelSpec:
    """d2l's ResNet-18 of the multi-GPU chapter: 3x3 stem, no max-pool, four stages
    64/128/256/512 of two residual blocks (1x1 conv shortcut when the shape changes),
    global average pool, dense."""
    stages = []
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512)):
        stride = 1 if i == 0 else 2
        blocks = seq(("0", _residual(cin, cout, stride)), ("1", _residual(cout, cout, 1)))
        stages.append((f"stage{i + 1}", blocks))
        cin = cout
    return ModelSpec(
        "resnet18",
        seq(
            ("conv1", Conv2d(in_channels, 64, 3, padding=1)),
            ("bn1", BatchNorm2d(64)),
            ("relu", ReLU()),
            *stages,
            ("pool", GlobalAvgPool2d()),
            ("flatten", Flatten()),
            ("fc", Linear(512, num_classes)),
        ),
        input_shape=(in_channels, 28, 28),
        num_classes=num_classes,
        init="normal",  # the seed's init_weights: N(0, 0.01) for every conv and linear
        init_std=0.01,
        description="d2l ResNet-18 variant with BatchNorm (1.1e7 parameters)",
    )


def _vit_block(width: int, heads: int, hidden: int) -> Sequential:
    """A pre-norm encoder block: ``x + attn(ln1(x))``, then ``+ mlp(ln2(.))`` (GELU)."""
    attention = seq(("ln", LayerNorm((width,))), ("attn", MultiHeadSelfAttention(width, heads)))
    mlp = seq(
        ("ln", LayerNorm((width,))),
        ("fc1", Linear(width, hidden)),
        ("gelu", GELU()),
        ("fc2", Linear(hidden, width)),
    )
    return seq(("attn", Add((seq(), attention))), ("mlp", Add((seq(), mlp))))


def vit_tiny(depth: int = 2, width: int = 64, heads: int = 4, mlp_ratio: int = 2) -> ModelSpec:
    """A small Vision Transformer for 28x28 images: 7x7 patches (a stride-7 Conv2d) to 16
    tokens of width 64, learned positions, ``depth`` pre-norm blocks of 4-head
    self-attention and a GELU MLP, a final LayerNorm, the tokens' mean (no class token:
    the global-average-pooled variant of "Better plain ViT baselines") and a Linear head."""
    tokens = (28 // 7) ** 2
    blocks = seq(*((str(i), _vit_block(width, heads, mlp_ratio * width)) for i in range(depth)))
    spec = ModelSpec(
        "vit-tiny",
        seq(
            ("patch", Conv2d(1, width, 7, stride=7)),
            ("tokens", Reshape((width, tokens))),
            ("to_tokens", Transpose(1, 2)),
            ("pos", PositionalEmbedding(tokens, width)),
            ("blocks", blocks),
            ("norm", LayerNorm((width,))),
            ("pool", Mean(1)),
            ("head", Linear(width, 10)),
        ),
        init="xavier_uniform",
    )
    about = (
        f"Vision Transformer: 7x7 patches, 16 tokens x {width}, {depth} pre-norm blocks "
        f"({heads} heads, MLP {mlp_ratio * width}), mean pool ({spec.num_parameters():,} "
        "parameters)"
    )
    return ModelSpec(**{**spec.__dict__, "description": about})


def _pre_norm_block(width: int, heads: int) -> Sequential:
    """``x + attn(ln(x))`` then ``x + fc2(gelu(fc1(ln(x))))`` (GPT-2's block, no dropout)."""
    attention = seq(
        ("ln", LayerNorm((width,))), ("attn", MultiHeadSelfAttention(width, heads, causal=True))
    )
    mlp = seq(
        ("ln", LayerNorm((width,))),
        ("fc1", Linear(width, 4 * width)),
        ("gelu", GELU()),
        ("fc2", Linear(4 * width, width)),
    )
    return seq(("attention", Add((seq(), attention))), ("mlp", Add((seq(), mlp))))


def char_transformer(
    vocab_size: int = 88, context: int = 64, width: int = 64, heads: int = 4, blocks: int = 2
) -> ModelSpec:
    """A character-level causal transformer LM: ids [N, T] -> next-id logits [N, T, V].
    The default vocabulary is the ``fortunes`` corpus's 88 characters."""
    net = seq(
        ("embed", Embedding(vocab_size, width)),
        ("pos", PositionalEmbedding(context, width)),
        *((f"block{i}", _pre_norm_block(width, heads)) for i in range(blocks)),
        ("ln", LayerNorm((width,))),
        ("head", Linear(width, vocab_size)),
    )
    return ModelSpec(
        name="char-transformer",
        net=net,
        input_shape=(context,),
        num_classes=vocab_size,
        init="normal",  # GPT-2's N(0, 0.02) for every weight; biases zero
        init_std=0.02,
        description=f"causal transformer LM, {blocks} pre-norm blocks of width {width}, "
        f"{heads} heads, context {context}, {vocab_size} characters",
    )


MODELS: dict[str, Callable[[], ModelSpec]] = {
    "lenet": lenet,
    "lenet-scratch": lenet_scratch,
    "paddle-mnist": paddle_mnist,
    "torch-dp-cnn": torch_dp_cnn,
    "mlp": mlp,
    "resnet18": resnet18,
    "char-transformer": char_transformer,
    "vit-tiny": vit_tiny,
}


def get_model_spec(name: str) -> ModelSpec:
    """A built-in spec by name; unknown names list the known ones."""
    try:
        return MODELS[name]()
    except KeyError:
        raise ConfigError(
            f"Unknown model {name!r}. Built-in models: {', '.join(MODELS)}; or your own: "
            "pkg.module:factory, or a spec file (.json, .toml)."
        ) from None
