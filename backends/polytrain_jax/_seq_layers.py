"""The sequence and transformer layers as builders of :data:`._net.BUILDERS`: Conv1d,
BatchNorm1d, LayerNorm, Embedding, PositionalEmbedding, the activations, Reshape,
Transpose, Mean and multi-head self-attention (PyTorch's semantics, as
:mod:`polytrain.neutral.reference_seq` and :mod:`~polytrain.neutral.reference_attention`
define them)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from polytrain.errors import BackendError
from polytrain.neutral.models import (
    GELU,
    BatchNorm1d,
    Conv1d,
    Embedding,
    LayerNorm,
    LogSoftmax,
    Mean,
    MultiHeadSelfAttention,
    PositionalEmbedding,
    Reshape,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
    Transpose,
)
from polytrain.neutral.reference_seq import sample_axis

from ._net import Apply, Array, Context, State, batch_norm, builds, conv, key, linear


@builds(Conv1d)
def _conv1d(layer: Conv1d, path: str) -> Apply:
    w, b = key(path, "weight"), key(path, "bias") if layer.bias else None

    def apply(state: State, x: Array, ctx: Context) -> Array:
        return conv(x, state[w], state[b] if b else None, layer.stride, layer.padding, "L")

    return apply


@builds(BatchNorm1d)
def _batch_norm1d(layer: BatchNorm1d, path: str) -> Apply:
    def apply(state: State, x: Array, ctx: Context) -> Array:
        return batch_norm(layer, path, state, x, ctx, (0, *range(2, x.ndim)))

    return apply


@builds(LayerNorm)
def _layer_norm(layer: LayerNorm, path: str) -> Apply:
    w, b = key(path, "weight"), key(path, "bias")

    def apply(state: State, x: Array, ctx: Context) -> Array:
        axes = tuple(range(x.ndim - len(layer.normalized_shape), x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        centred = x - mean
        y = centred / jnp.sqrt(jnp.square(centred).mean(axis=axes, keepdims=True) + layer.eps)
        return y * state[w] + state[b] if layer.elementwise_affine else y

    return apply


@builds(Embedding)
def _embedding(layer: Embedding, path: str) -> Apply:
    w = key(path, "weight")
    return lambda state, x, ctx: jnp.take(state[w], x.astype(jnp.int32), axis=0)


@builds(PositionalEmbedding)
def _positional(layer: PositionalEmbedding, path: str) -> Apply:
    w = key(path, "weight")

    def apply(state: State, x: Array, ctx: Context) -> Array:
        if x.ndim != 3 or x.shape[1] > layer.max_len:
            raise BackendError(
                f"PositionalEmbedding({layer.max_len}) needs [N, T<=max_len, E], got "
                f"{tuple(x.shape)}."
            )
        return x + state[w][: x.shape[1]]

    return apply


def _activation(layer: Any) -> Callable[[Array], Array]:
    """The element-wise (or along-an-axis) function of an activation layer."""
    if isinstance(layer, GELU):
        return partial(jax.nn.gelu, approximate=layer.approximate == "tanh")
    if isinstance(layer, SiLU):
        return lambda x: x * jax.nn.sigmoid(x)
    if isinstance(layer, Tanh):
        return jnp.tanh
    if isinstance(layer, Sigmoid):
        return jax.nn.sigmoid
    if isinstance(layer, Softmax):
        return partial(jax.nn.softmax, axis=layer.dim)
    return partial(jax.nn.log_softmax, axis=layer.dim)


@builds(GELU, SiLU, Tanh, Sigmoid, Softmax, LogSoftmax)
def _activations(layer: Any, path: str) -> Apply:
    f = _activation(layer)
    return lambda state, x, ctx: f(x)


@builds(Reshape)
def _reshape(layer: Reshape, path: str) -> Apply:
    return lambda state, x, ctx: x.reshape(x.shape[0], *layer.shape)


@builds(Transpose)
def _transpose(layer: Transpose, path: str) -> Apply:
    def apply(state: State, x: Array, ctx: Context) -> Array:
        what = f"Transpose({layer.dim0}, {layer.dim1})"
        return jnp.swapaxes(x, sample_axis(layer.dim0, x, what), sample_axis(layer.dim1, x, what))

    return apply


@builds(Mean)
def _mean(layer: Mean, path: str) -> Apply:
    return lambda state, x, ctx: x.mean(axis=sample_axis(layer.dim, x, f"Mean({layer.dim})"))


@builds(MultiHeadSelfAttention)
def _attention(layer: MultiHeadSelfAttention, path: str) -> Apply:
    """PyTorch's ``nn.MultiheadAttention`` (batch first, query = key = value, no dropout)."""
    e, h = layer.embed_dim, layer.num_heads
    names = {n: key(path, n) for n in ("in_proj_weight", "in_proj_bias")}
    names |= {n: key(path, f"out_proj.{n}") for n in ("weight", "bias")}

    def heads(a: Array) -> Array:
        n, t, _ = a.shape
        return a.reshape(n, t, h, e // h).transpose(0, 2, 1, 3)

    def apply(state: State, x: Array, ctx: Context) -> Array:
        bias = (lambda n: state[names[n]]) if layer.bias else (lambda n: None)
        qkv = linear(x, state[names["in_proj_weight"]], bias("in_proj_bias"))
        q, k, v = (heads(qkv[..., i * e : (i + 1) * e]) for i in range(3))
        high = lax.Precision.HIGHEST
        scores = jnp.matmul(q, k.transpose(0, 1, 3, 2), precision=high) / math.sqrt(e // h)
        if layer.causal:
            t = x.shape[1]
            scores = jnp.where(jnp.triu(jnp.ones((t, t), bool), 1), -jnp.inf, scores)
        probs = jax.nn.softmax(scores, axis=-1)
        n, _, t, d = q.shape
        context = jnp.matmul(probs, v, precision=high).transpose(0, 2, 1, 3).reshape(n, t, h * d)
        return linear(context, state[names["weight"]], bias("bias"))

    return apply
