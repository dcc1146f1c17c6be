"""polytrain's canonical update rules written out with mx.nd ops.

MXNet's own optimizers differ from PyTorch's: SGD puts the learning rate inside the
momentum buffer (diverges once lr changes) and Adam folds the bias correction into lr,
which also rescales eps. So every rule of :mod:`polytrain.optim` is applied here, in
place, on every context's copy of every parameter.
"""

from __future__ import annotations

import math
from typing import Any

import mxnet as mx
import numpy as np

from polytrain.backend import Model
from polytrain.optim import STATE_SLOTS, Optimizer, OptimizerConfig


class MXNetOptimizer(Optimizer):
    """Canonical rules on each context; identical gradients keep the copies identical."""

    def __init__(self, model: Model, config: OptimizerConfig) -> None:
        super().__init__(config)
        self.model = model
        params = model.private["params"]
        self.params = [(n, params[n]) for n in model.private["trainable"]]
        # per parameter, per context: slot name -> NDArray (created at the first step)
        self.state: dict[str, list[dict[str, Any]]] = {
            n: [{} for _ in model.devices] for n, _ in self.params
        }

    def step(self) -> None:
        self.step_count += 1
        for name, p in self.params:
            decay = self.config.decay_for(name)
            for ctx, slots in zip(self.model.devices, self.state[name], strict=True):
                w, g = p.data(ctx), p.grad(ctx)
                if decay:
                    g = g + decay * w  # L2, added to the gradient as in torch
                self._update(w, g, slots)

    def _update(self, w: Any, g: Any, slots: dict[str, Any]) -> None:
        cfg, lr = self.config, self.lr
        if cfg.name == "sgd":
            w -= lr * g
        elif cfg.name == "momentum":
            buf = slots.get("momentum_buffer")
            if buf is None:
                buf = slots["momentum_buffer"] = g.copy()
            else:
                buf[:] = cfg.momentum * buf + g
            w -= lr * buf  # lr outside the buffer
        elif cfg.name == "adagrad":
            total = slots.setdefault("sum", mx.nd.zeros_like(w))
            total += g * g
            w -= lr * g / (mx.nd.sqrt(total) + cfg.epsilon)  # eps outside the sqrt
        else:
            b1, b2 = cfg.betas
            t = self.step_count
            m = slots.setdefault("exp_avg", mx.nd.zeros_like(w))
            v = slots.setdefault("exp_avg_sq", mx.nd.zeros_like(w))
            m[:] = b1 * m + (1 - b1) * g
            v[:] = b2 * v + (1 - b2) * g * g
            denom = mx.nd.sqrt(v) / math.sqrt(1 - b2**t) + cfg.epsilon
            w -= (lr / (1 - b1**t)) * m / denom

    def zero_grad(self) -> None:
        self.model.native.collect_params().zero_grad()

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        names = STATE_SLOTS[self.config.name]
        return {
            n: {s: a.asnumpy() for s, a in self.state[n][0].items() if s in names}
            for n, _ in self.params
        }

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        for name, _ in self.params:
            given = slots.get(name, {})
            for ctx, state in zip(self.model.devices, self.state[name], strict=True):
                for slot, value in given.items():
                    state[slot] = mx.nd.array(np.asarray(value, np.float32), ctx=ctx)
