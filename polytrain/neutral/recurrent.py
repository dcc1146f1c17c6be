"""The recurrent layers of the neutral set: LSTM and GRU, PyTorch's ``nn.LSTM``/``nn.GRU``
with ``batch_first=True``, unidirectional, started from a zero state, giving the output
sequence only (no final states). Their canonical parameters are torch's, per layer ``k``:
``weight_ih_l<k>`` [G*H, in], ``weight_hh_l<k>`` [G*H, H], ``bias_ih_l<k>``,
``bias_hh_l<k>`` [G*H], the G gate blocks stacked in torch's order (LSTM i, f, g, o;
GRU r, z, n); see docs/semantics.md for how the other frameworks order and name them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from polytrain.errors import ConfigError


@dataclass(frozen=True)
class _Recurrent:
    input_size: int
    hidden_size: int
    num_layers: int = 1

    def __post_init__(self) -> None:
        sizes = (self.input_size, self.hidden_size, self.num_layers)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
            raise ConfigError(
                f"{type(self).__name__}: input_size, hidden_size and num_layers must be "
                f"integers >= 1, got {sizes}."
            )

    @property
    def gates(self) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class LSTM(_Recurrent):
    """[N, T, input_size] -> [N, T, hidden_size]: ``c = f*c + i*g``, ``h = o*tanh(c)``
    with i, f, o sigmoid and g tanh of ``W_ih x + b_ih + W_hh h + b_hh`` (gates i, f, g, o)."""

    @property
    def gates(self) -> int:
        return 4


@dataclass(frozen=True)
class GRU(_Recurrent):
    """[N, T, input_size] -> [N, T, hidden_size], torch's (cuDNN's) GRU: r, z sigmoid of
    ``W_i x + b_i + W_h h + b_h``, ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`` (the
    reset gate applied *after* the recurrent product), ``h = (1 - z) * n + z * h``."""

    @property
    def gates(self) -> int:
        return 3


RecurrentLayer = LSTM | GRU


def recurrent_parameters(layer: LSTM | GRU) -> dict[str, tuple[int, ...]]:
    """nn.LSTM's / nn.GRU's state-dict entries, in its order (layer by layer)."""
    rows, h = layer.gates * layer.hidden_size, layer.hidden_size
    shapes: dict[str, tuple[int, ...]] = {}
    for k in range(layer.num_layers):
        width = layer.input_size if k == 0 else h
        shapes[f"weight_ih_l{k}"] = (rows, width)
        shapes[f"weight_hh_l{k}"] = (rows, h)
        shapes[f"bias_ih_l{k}"] = (rows,)
        shapes[f"bias_hh_l{k}"] = (rows,)
    return shapes


def recurrent_init(
    layer: LSTM | GRU, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """U(-1/sqrt(H), 1/sqrt(H)) for every weight and bias, torch's own rule for its
    recurrent layers; used whatever the spec's init rule (which names Conv/Linear rules)."""
    bound = 1 / math.sqrt(layer.hidden_size)
    return rng.uniform(-bound, bound, shape).astype(np.float32)
