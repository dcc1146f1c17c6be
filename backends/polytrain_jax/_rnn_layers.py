"""LSTM and GRU as builders of :data:`._net.BUILDERS`: PyTorch's ``nn.LSTM``/``nn.GRU``
(batch first, zero start, the output sequence), one ``lax.scan`` over time per layer, with
torch's parameter names and gate order (LSTM i, f, g, o; GRU r, z, n)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from polytrain.neutral.models import GRU, LSTM

from ._net import Apply, Array, Context, State, builds, key, linear


def _lstm_cell(size: int, w_hh: Array, b_hh: Array) -> Any:
    def step(carry: tuple[Array, Array], a: Array) -> tuple[tuple[Array, Array], Array]:
        h, c = carry
        z = a + linear(h, w_hh, b_hh)
        i, f = jax.nn.sigmoid(z[:, :size]), jax.nn.sigmoid(z[:, size : 2 * size])
        g, o = jnp.tanh(z[:, 2 * size : 3 * size]), jax.nn.sigmoid(z[:, 3 * size :])
        c = f * c + i * g
        h = o * jnp.tanh(c)
        return (h, c), h

    return step


def _gru_cell(size: int, w_hh: Array, b_hh: Array) -> Any:
    def step(h: Array, a: Array) -> tuple[Array, Array]:
        hn = linear(h, w_hh, b_hh)
        r = jax.nn.sigmoid(a[:, :size] + hn[:, :size])
        z = jax.nn.sigmoid(a[:, size : 2 * size] + hn[:, size : 2 * size])
        cand = jnp.tanh(a[:, 2 * size :] + r * hn[:, 2 * size :])
        h = (1.0 - z) * cand + z * h
        return h, h

    return step


def _recurrent(layer: LSTM | GRU, path: str) -> Apply:
    size = layer.hidden_size
    lstm = isinstance(layer, LSTM)

    def apply(state: State, x: Array, ctx: Context) -> Array:
        for k in range(layer.num_layers):
            w_ih, w_hh, b_ih, b_hh = (
                state[key(path, f"{n}_l{k}")]
                for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            )
            inputs = linear(x, w_ih, b_ih).transpose(1, 0, 2)  # [T, N, G*H]
            zero = jnp.zeros((x.shape[0], size), x.dtype)
            hs: Array
            if lstm:
                _, hs = lax.scan(_lstm_cell(size, w_hh, b_hh), (zero, zero), inputs)
            else:
                _, hs = lax.scan(_gru_cell(size, w_hh, b_hh), zero, inputs)
            x = hs.transpose(1, 0, 2)
        return x

    return apply


builds(LSTM, GRU)(_recurrent)
