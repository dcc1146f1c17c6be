"""Numpy reference of the recurrent layers (LSTM, GRU), forward and backward through time.

Torch's equations and gate order (see :mod:`polytrain.neutral.recurrent`), batch first,
zero initial state. Written in the input's dtype: the reference calls it in float64, the
numpy backend in its own dtype, so the backend is the reference's exact twin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polytrain.neutral.recurrent import GRU, LSTM, recurrent_parameters

Weights = dict[str, np.ndarray]  # the layer's canonical leaves: weight_ih_l0, ...


@dataclass(frozen=True)
class StackCache:
    """What the backward needs of one stacked layer: its input [N, T, in], hidden states
    ``h`` [N, T+1, H] (``h[:, 0]`` the zero start), the activated gates [N, T, G*H]
    (LSTM i, f, g, o; GRU r, z, n), and per kind: LSTM cell states ``c`` [N, T+1, H],
    GRU ``hn`` = W_hn h + b_hn [N, T, H] (what the reset gate multiplies)."""

    x: np.ndarray
    h: np.ndarray
    gates: np.ndarray
    extra: np.ndarray


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _lstm_layer(x: np.ndarray, w: Weights, k: int) -> StackCache:
    n, t, _ = x.shape
    size = w[f"weight_hh_l{k}"].shape[1]
    w_hh, b_hh = w[f"weight_hh_l{k}"], w[f"bias_hh_l{k}"]
    inputs = x @ w[f"weight_ih_l{k}"].T + w[f"bias_ih_l{k}"]  # [N, T, 4H], every step at once
    h = np.zeros((n, t + 1, size), x.dtype)
    c = np.zeros((n, t + 1, size), x.dtype)
    gates = np.empty_like(inputs)
    for s in range(t):
        a = inputs[:, s] + (h[:, s] @ w_hh.T + b_hh)
        i, f = sigmoid(a[:, :size]), sigmoid(a[:, size : 2 * size])
        g, o = np.tanh(a[:, 2 * size : 3 * size]), sigmoid(a[:, 3 * size :])
        c[:, s + 1] = f * c[:, s] + i * g
        h[:, s + 1] = o * np.tanh(c[:, s + 1])
        gates[:, s] = np.concatenate([i, f, g, o], axis=1)
    return StackCache(x, h, gates, c)


def _gru_layer(x: np.ndarray, w: Weights, k: int) -> StackCache:
    n, t, _ = x.shape
    size = w[f"weight_hh_l{k}"].shape[1]
    w_hh, b_hh = w[f"weight_hh_l{k}"], w[f"bias_hh_l{k}"]
    inputs = x @ w[f"weight_ih_l{k}"].T + w[f"bias_ih_l{k}"]  # [N, T, 3H]
    h = np.zeros((n, t + 1, size), x.dtype)
    hn = np.empty((n, t, size), x.dtype)
    gates = np.empty_like(inputs)
    for s in range(t):
        a, b = inputs[:, s], h[:, s] @ w_hh.T + b_hh
        r = sigmoid(a[:, :size] + b[:, :size])
        z = sigmoid(a[:, size : 2 * size] + b[:, size : 2 * size])
        hn[:, s] = b[:, 2 * size :]
        cand = np.tanh(a[:, 2 * size :] + r * hn[:, s])
        h[:, s + 1] = (1.0 - z) * cand + z * h[:, s]
        gates[:, s] = np.concatenate([r, z, cand], axis=1)
    return StackCache(x, h, gates, hn)


def recurrent(layer: LSTM | GRU, w: Weights, x: np.ndarray) -> tuple[np.ndarray, list[StackCache]]:
    """The top layer's hidden state at every step, [N, T, H], for x [N, T, input_size]."""
    if x.ndim != 3 or x.shape[2] != layer.input_size:
        raise ValueError(f"{layer!r} needs [N, T, {layer.input_size}], got {x.shape}")
    run = _lstm_layer if isinstance(layer, LSTM) else _gru_layer
    caches = []
    for k in range(layer.num_layers):
        caches.append(run(x, w, k))
        x = caches[-1].h[:, 1:]
    return x, caches


def _lstm_layer_backward(cache: StackCache, w: Weights, k: int, g: np.ndarray) -> np.ndarray:
    """d(loss)/d(every step's gate pre-activation), [N, T, 4H], given ``g`` = d/d(outputs)."""
    size, w_hh = cache.h.shape[2], w[f"weight_hh_l{k}"]
    c = cache.extra
    da = np.empty_like(cache.gates)
    dh_next = np.zeros_like(cache.h[:, 0])
    dc_next = np.zeros_like(dh_next)
    for s in reversed(range(g.shape[1])):
        i, f = cache.gates[:, s, :size], cache.gates[:, s, size : 2 * size]
        gg, o = cache.gates[:, s, 2 * size : 3 * size], cache.gates[:, s, 3 * size :]
        tanh_c = np.tanh(c[:, s + 1])
        dh = g[:, s] + dh_next
        dc = dh * o * (1.0 - tanh_c * tanh_c) + dc_next
        da[:, s] = np.concatenate(
            [
                dc * gg * i * (1.0 - i),
                dc * c[:, s] * f * (1.0 - f),
                dc * i * (1.0 - gg * gg),
                dh * tanh_c * o * (1.0 - o),
            ],
            axis=1,
        )
        dc_next = dc * f
        dh_next = da[:, s] @ w_hh
    return da


def _gru_layer_backward(
    cache: StackCache, w: Weights, k: int, g: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """d(loss)/d(W_ih x + b_ih) and d/d(W_hh h + b_hh) at every step, each [N, T, 3H]."""
    size, w_hh = cache.h.shape[2], w[f"weight_hh_l{k}"]
    d_in, d_rec = np.empty_like(cache.gates), np.empty_like(cache.gates)
    dh_next = np.zeros_like(cache.h[:, 0])
    for s in reversed(range(g.shape[1])):
        r, z = cache.gates[:, s, :size], cache.gates[:, s, size : 2 * size]
        cand, h_prev = cache.gates[:, s, 2 * size :], cache.h[:, s]
        dh = g[:, s] + dh_next
        d_cand = dh * (1.0 - z) * (1.0 - cand * cand)
        dr = d_cand * cache.extra[:, s] * r * (1.0 - r)
        dz = dh * (h_prev - cand) * z * (1.0 - z)
        d_in[:, s] = np.concatenate([dr, dz, d_cand], axis=1)
        d_rec[:, s] = np.concatenate([dr, dz, d_cand * r], axis=1)
        dh_next = dh * z + d_rec[:, s] @ w_hh
    return d_in, d_rec


def recurrent_backward(
    layer: LSTM | GRU, w: Weights, caches: list[StackCache], g: np.ndarray
) -> tuple[np.ndarray, Weights]:
    """Gradients w.r.t. the input and the layer's leaves, given ``g`` = d(loss)/d(output)."""
    grads: Weights = {}
    for k in reversed(range(layer.num_layers)):
        cache = caches[k]
        if isinstance(layer, LSTM):
            d_in = d_rec = _lstm_layer_backward(cache, w, k, g)
        else:
            d_in, d_rec = _gru_layer_backward(cache, w, k, g)
        h_prev = cache.h[:, :-1]
        grads[f"weight_ih_l{k}"] = np.einsum("ntg,nti->gi", d_in, cache.x)
        grads[f"weight_hh_l{k}"] = np.einsum("ntg,nti->gi", d_rec, h_prev)
        grads[f"bias_ih_l{k}"] = d_in.sum(axis=(0, 1))
        grads[f"bias_hh_l{k}"] = d_rec.sum(axis=(0, 1))
        g = d_in @ w[f"weight_ih_l{k}"]
    return g, grads


def leaves(layer: LSTM | GRU, w: Weights, path: str) -> Weights:
    """The layer's own entries of canonical ``w``, by leaf name."""
    prefix = f"{path}." if path else ""
    return {leaf: w[prefix + leaf] for leaf in recurrent_parameters(layer)}
