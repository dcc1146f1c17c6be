"""LeNet (or ``vit-tiny``) on Fashion-MNIST written by hand, as a JAX user would without
Flax or optax: the model a pure function of a parameter dict, one ``jax.jit`` step (forward,
loss, ``jax.value_and_grad``, SGD with momentum, the accuracy count), ``float(loss)`` every
step."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from polytrain.neutral.models import get_model_spec

from .common import Clock, Measurement, Workload, batches, initial_weights

NAMES = ("conv1_w", "conv1_b", "conv2_w", "conv2_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b")


def _conv(x: Any, w: Any, b: Any) -> Any:
    return lax.conv_general_dilated(x, w, (1, 1), "VALID") + b[None, :, None, None]


def _avg_pool(x: Any) -> Any:
    return lax.reduce_window(x, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4.0


def lenet(p: dict[str, Any], x: Any) -> Any:
    h = _avg_pool(jax.nn.relu(_conv(x, p["conv1_w"], p["conv1_b"])))
    h = _avg_pool(jax.nn.relu(_conv(h, p["conv2_w"], p["conv2_b"])))
    h = h.reshape(h.shape[0], -1)
    h = jax.nn.relu(h @ p["fc1_w"].T + p["fc1_b"])
    return h @ p["fc2_w"].T + p["fc2_b"]


# -- vit-tiny: 7x7 patches -> 16 tokens x 64, learned positions, pre-norm blocks, mean pool --

HEADS = 4


def _layer_norm(x: Any, w: Any, b: Any) -> Any:
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * w + b


def _attention(p: dict[str, Any], pre: str, x: Any) -> Any:
    """torch's ``nn.MultiheadAttention`` (q, k, v rows of one in-projection), no mask."""
    n, t, e = x.shape
    qkv = x @ p[pre + "in_proj_weight"].T + p[pre + "in_proj_bias"]
    q, k, v = (a.reshape(n, t, HEADS, e // HEADS).transpose(0, 2, 1, 3)
               for a in jnp.split(qkv, 3, axis=-1))  # fmt: skip
    probs = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(e // HEADS), axis=-1)
    context = (probs @ v).transpose(0, 2, 1, 3).reshape(n, t, e)
    return context @ p[pre + "out_proj.weight"].T + p[pre + "out_proj.bias"]


def _vit_block(p: dict[str, Any], pre: str, x: Any) -> Any:
    a, m = pre + "attn.branches.1.", pre + "mlp.branches.1."
    x = x + _attention(p, a + "attn.", _layer_norm(x, p[a + "ln.weight"], p[a + "ln.bias"]))
    h = _layer_norm(x, p[m + "ln.weight"], p[m + "ln.bias"])
    h = jax.nn.gelu(h @ p[m + "fc1.weight"].T + p[m + "fc1.bias"], approximate=False)
    return x + h @ p[m + "fc2.weight"].T + p[m + "fc2.bias"]


def vit(p: dict[str, Any], x: Any) -> Any:
    """The ``vit-tiny`` spec's forward pass, its parameters under the spec's names."""
    h = lax.conv_general_dilated(x, p["patch.weight"], (7, 7), "VALID")
    h = h + p["patch.bias"][None, :, None, None]
    h = h.reshape(h.shape[0], h.shape[1], -1).transpose(0, 2, 1) + p["pos.weight"]
    for i in range(2):
        h = _vit_block(p, f"blocks.{i}.", h)
    h = _layer_norm(h, p["norm.weight"], p["norm.bias"]).mean(axis=1)
    return h @ p["head.weight"].T + p["head.bias"]


MODELS = {"lenet": lenet, "vit-tiny": vit}


def initial_params(work: Workload) -> dict[str, Any]:
    """The spec's initial weights: LeNet's under this file's names, the others' own."""
    if work.model == "lenet":
        weights = initial_weights(work.seed)
        return {n: jnp.asarray(w) for n, w in zip(NAMES, weights, strict=True)}
    spec_weights = get_model_spec(work.model).init_params(work.seed)
    return {n: jnp.asarray(w) for n, w in spec_weights.items()}


def make_step(lr: float, momentum: float, model: str = "lenet") -> Any:
    forward = MODELS[model]

    def loss_fn(p: dict[str, Any], x: Any, y: Any) -> tuple[Any, Any]:
        logits = forward(p, x)
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean(), logits

    @jax.jit
    def step(p: dict[str, Any], buf: dict[str, Any], x: Any, y: Any) -> tuple[Any, ...]:
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y)
        buf = jax.tree_util.tree_map(lambda b, g: momentum * b + g, buf, grads)
        p = jax.tree_util.tree_map(lambda w, b: w - lr * b, p, buf)
        correct = (logits.argmax(axis=1) == y).sum()
        return p, buf, loss, correct

    return step


def run(work: Workload, x: np.ndarray, y: np.ndarray) -> Measurement:
    params = initial_params(work)
    buf = jax.tree_util.tree_map(jnp.zeros_like, params)
    step_fn = make_step(work.lr, work.momentum, work.model)
    clock = Clock(work)
    total_loss, correct = 0.0, 0
    loss = jnp.zeros(())
    for step, (xb, yb) in enumerate(batches(x, y, work)):
        params, buf, loss, hits = step_fn(params, buf, xb, yb.astype(np.int32))
        total_loss += float(loss) * len(yb)
        correct += int(hits)
        clock.tick(step, lambda p=params: jax.block_until_ready(p))  # type: ignore[misc]
    return clock.measurement("native", float(loss))
