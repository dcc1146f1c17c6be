"""LeNet on Fashion-MNIST written by hand, as a JAX user would without Flax or optax: the
model a pure function of a parameter dict, one ``jax.jit`` step (forward, loss,
``jax.value_and_grad``, SGD with momentum, the accuracy count), ``float(loss)`` every step."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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


def make_step(lr: float, momentum: float) -> Any:
    def loss_fn(p: dict[str, Any], x: Any, y: Any) -> tuple[Any, Any]:
        logits = lenet(p, x)
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
    params = {n: jnp.asarray(w) for n, w in zip(NAMES, initial_weights(work.seed), strict=True)}
    buf = jax.tree_util.tree_map(jnp.zeros_like, params)
    step_fn = make_step(work.lr, work.momentum)
    clock = Clock(work)
    total_loss, correct = 0.0, 0
    loss = jnp.zeros(())
    for step, (xb, yb) in enumerate(batches(x, y, work)):
        params, buf, loss, hits = step_fn(params, buf, xb, yb.astype(np.int32))
        total_loss += float(loss) * len(yb)
        correct += int(hits)
        clock.tick(step, lambda p=params: jax.block_until_ready(p))  # type: ignore[misc]
    return clock.measurement("native", float(loss))
