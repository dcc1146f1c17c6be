"""The initialisation rules a spec names: initial weights drawn here, in numpy, from the
seed, so every backend starts from the same numbers (the initialisation contract in
docs/architecture.md).

* ``fan_in_uniform``: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which is
  PyTorch's default for Conv/Linear (``kaiming_uniform_(a=sqrt(5))``); the name it had
  before, ``torch_default``, is still accepted in specs and files;
* ``xavier_uniform``: U(+-sqrt(6 / (fan_in + fan_out))), biases zero;
* ``kaiming_normal``: N(0, 2 / fan_out) (fan_out, relu), biases zero;
* ``normal``: N(0, ``init_std``) (d2l's scratch recipe), biases zero.

BatchNorm and LayerNorm start at 1/0 (running statistics 0/1); embeddings N(0, 1),
positions N(0, 0.02) (or N(0, ``init_std``) under ``normal``); attention and recurrent
layers follow their PyTorch modules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from polytrain.errors import ConfigError
from polytrain.neutral.models.layers import (
    BatchNorm1d,
    BatchNorm2d,
    Embedding,
    Layer,
    LayerNorm,
    MultiHeadSelfAttention,
    PositionalEmbedding,
)
from polytrain.neutral.models.parameters import fans, layer_parameters
from polytrain.neutral.recurrent import RecurrentLayer, recurrent_init

INIT_RULES = ("fan_in_uniform", "xavier_uniform", "kaiming_normal", "normal")
#: former names, still read from specs and files
INIT_ALIASES = {"torch_default": "fan_in_uniform"}


def init_rule(name: str) -> str:
    """The rule's current name (an old one mapped); ConfigError for an unknown one."""
    rule = INIT_ALIASES.get(name, name)
    if rule not in INIT_RULES:
        raise ConfigError(f"Unknown init rule {name!r}; use one of {INIT_RULES}.")
    return rule


def initial_parameters(
    layers: Iterable[tuple[str, Layer]], rule: str, std: float, seed: int
) -> dict[str, np.ndarray]:
    """Float32 initial weights of ``layers`` (path, leaf) from ``seed``: each tensor from
    its own generator seeded with (seed, its index), so adding a layer does not shift the
    others."""
    out: dict[str, np.ndarray] = {}
    index = 0
    for path, layer in layers:
        for name, shape in layer_parameters(layer).items():
            rng = np.random.default_rng([seed, index])
            index += 1
            out[f"{path}.{name}"] = _initial(layer, name, shape, rng, rule, std)
    return out


def _initial(
    layer: Layer,
    name: str,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    rule: str,
    std: float,
) -> np.ndarray:
    if isinstance(layer, BatchNorm2d | BatchNorm1d | LayerNorm):
        value = 1.0 if name in ("weight", "running_var") else 0.0
        return np.full(shape, value, dtype=np.float32)
    if isinstance(layer, Embedding | PositionalEmbedding):
        default = 1.0 if isinstance(layer, Embedding) else 0.02
        return rng.normal(0.0, std if rule == "normal" else default, shape).astype(np.float32)
    if isinstance(layer, MultiHeadSelfAttention):
        return _attention(name, shape, rng, rule, std)
    if isinstance(layer, RecurrentLayer):
        return recurrent_init(layer, shape, rng)
    fan_in, fan_out = fans(layer)
    if name == "bias" and rule != "fan_in_uniform":
        return np.zeros(shape, dtype=np.float32)
    return _weight(shape, fan_in, fan_out, rng, rule, std)


def _weight(
    shape: tuple[int, ...],
    fan_in: int,
    fan_out: int,
    rng: np.random.Generator,
    rule: str,
    std: float,
) -> np.ndarray:
    """A weight (or a ``fan_in_uniform`` bias) of the given fans by ``rule``."""
    if rule == "fan_in_uniform":
        bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)); biases alike
        return rng.uniform(-bound, bound, shape).astype(np.float32)
    if rule == "xavier_uniform":
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, shape).astype(np.float32)
    if rule == "kaiming_normal":
        return rng.normal(0.0, math.sqrt(2.0 / fan_out), shape).astype(np.float32)
    return rng.normal(0.0, std, shape).astype(np.float32)


def _attention(
    name: str, shape: tuple[int, ...], rng: np.random.Generator, rule: str, std: float
) -> np.ndarray:
    """PyTorch's nn.MultiheadAttention: biases zero; ``fan_in_uniform`` draws
    in_proj_weight xavier-uniform over [3E, E] and out_proj.weight as a Linear."""
    if len(shape) == 1:
        return np.zeros(shape, dtype=np.float32)
    fan_out, fan_in = shape
    if rule == "fan_in_uniform" and name == "in_proj_weight":
        rule = "xavier_uniform"
    return _weight(shape, fan_in, fan_out, rng, rule, std)
