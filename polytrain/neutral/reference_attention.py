"""Numpy reference of multi-head self-attention, forward and backward (PyTorch's
``nn.MultiheadAttention`` with ``batch_first=True``, query = key = value, no dropout).

Written in the input's dtype (the reference calls it in float64; the numpy backend calls
the same functions in its own dtype, so it is the reference's exact twin).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polytrain.neutral.models import MultiHeadSelfAttention, layer_parameters

Weights = dict[str, np.ndarray]  # the layer's canonical leaves: in_proj_weight, ...


@dataclass(frozen=True)
class AttentionCache:
    """What the backward needs from the forward: per-head q, k, v [N, H, T, D], the
    attention probabilities [N, H, T, T] and the heads' joined output [N, T, E]."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    probs: np.ndarray
    context: np.ndarray


def causal_mask(t: int) -> np.ndarray:
    """[T, T] booleans, True where a query position may not see a key (key after query)."""
    return np.triu(np.ones((t, t), dtype=bool), 1)


def _heads(a: np.ndarray, h: int) -> np.ndarray:
    n, t, e = a.shape
    return a.reshape(n, t, h, e // h).transpose(0, 2, 1, 3)


def _join(a: np.ndarray) -> np.ndarray:
    n, h, t, d = a.shape
    return a.transpose(0, 2, 1, 3).reshape(n, t, h * d)


def self_attention(
    layer: MultiHeadSelfAttention, w: Weights, x: np.ndarray
) -> tuple[np.ndarray, AttentionCache]:
    """``out_proj(softmax(q k^T / sqrt(D) [+ causal -inf]) v)`` for x [N, T, E], with
    q, k, v = the three E-row blocks of ``in_proj``."""
    e, h = layer.embed_dim, layer.num_heads
    qkv = x @ w["in_proj_weight"].T
    if layer.bias:
        qkv = qkv + w["in_proj_bias"]
    q, k, v = (_heads(qkv[..., i * e : (i + 1) * e], h) for i in range(3))
    scores = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(e // h).astype(x.dtype)
    if layer.causal:
        scores = np.where(causal_mask(x.shape[1]), -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    context = _join(probs @ v)
    y = context @ w["out_proj.weight"].T
    if layer.bias:
        y = y + w["out_proj.bias"]
    return y, AttentionCache(q, k, v, probs, context)


def self_attention_backward(
    layer: MultiHeadSelfAttention, w: Weights, x: np.ndarray, cache: AttentionCache, g: np.ndarray
) -> tuple[np.ndarray, Weights]:
    """Gradients w.r.t. ``x`` and the layer's leaves, given ``g`` = d(loss)/d(output)."""
    e, h = layer.embed_dim, layer.num_heads
    grads: Weights = {"out_proj.weight": np.einsum("nti,ntj->ij", g, cache.context)}
    if layer.bias:
        grads["out_proj.bias"] = g.sum(axis=(0, 1))
    g_out = _heads(g @ w["out_proj.weight"], h)  # d/d(probs @ v), [N, H, T, D]
    g_probs = g_out @ cache.v.transpose(0, 1, 3, 2)
    g_v = cache.probs.transpose(0, 1, 3, 2) @ g_out
    p = cache.probs
    g_scores = p * (g_probs - (g_probs * p).sum(axis=-1, keepdims=True))
    g_scores = g_scores / np.sqrt(e // h).astype(x.dtype)
    g_q = g_scores @ cache.k
    g_k = g_scores.transpose(0, 1, 3, 2) @ cache.q
    g_qkv = np.concatenate([_join(g_q), _join(g_k), _join(g_v)], axis=-1)
    grads["in_proj_weight"] = np.einsum("nti,ntj->ij", g_qkv, x)
    if layer.bias:
        grads["in_proj_bias"] = g_qkv.sum(axis=(0, 1))
    return g_qkv @ w["in_proj_weight"], grads


def leaves(layer: MultiHeadSelfAttention, w: Weights, path: str) -> Weights:
    """The layer's own entries of canonical ``w``, by leaf name."""
    prefix = f"{path}." if path else ""
    return {leaf: w[prefix + leaf] for leaf in layer_parameters(layer)}
