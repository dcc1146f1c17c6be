"""The canonical update rules of :mod:`polytrain.neutral.optim`, in the model's dtype,
in place on every replica's parameters."""

from __future__ import annotations

import math

import numpy as np

from polytrain.backend.base import Model
from polytrain.neutral.optim import STATE_SLOTS, Optimizer, OptimizerConfig

from ._layers import NumpyModel, NumpyNet


class NumpyOptimizer(Optimizer):
    """One set of state slots per replica; identical gradients keep replicas identical."""

    def __init__(self, model: Model, config: OptimizerConfig) -> None:
        super().__init__(config)
        self.nets: list[NumpyNet] = NumpyModel.of(model).nets
        self.decay = {name: config.decay_for(name) for name in self.nets[0].params}
        self.slots: list[dict[str, dict[str, np.ndarray]]] = [{} for _ in self.nets]

    def step(self) -> None:
        t = self.step_count + 1
        with np.errstate(all="ignore"):
            for net, slots in zip(self.nets, self.slots, strict=True):
                grads = net.grads()
                for name, p in net.params.items():
                    self._update(p.data, grads[name], slots.setdefault(name, {}), name, t)
        self.step_count = t

    def _update(
        self, p: np.ndarray, grad: np.ndarray, st: dict[str, np.ndarray], name: str, t: int
    ) -> None:
        c, lr = self.config, self.lr
        wd = self.decay[name]
        g = grad + wd * p if wd else grad
        if c.name == "sgd":
            p -= lr * g
        elif c.name == "momentum":
            buf = st.get("momentum_buffer")
            if buf is None:
                st["momentum_buffer"] = buf = g.copy()
            else:
                buf *= c.momentum
                buf += g
            p -= lr * buf
        elif c.name == "adagrad":
            total = st.setdefault("sum", np.zeros_like(p))
            total += g * g
            p -= lr * g / (np.sqrt(total) + c.epsilon)
        else:
            b1, b2 = c.betas
            m = st.setdefault("exp_avg", np.zeros_like(p))
            v = st.setdefault("exp_avg_sq", np.zeros_like(p))
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            denom = np.sqrt(v) / math.sqrt(1 - b2**t) + c.epsilon
            p -= lr / (1 - b1**t) * m / denom

    def zero_grad(self) -> None:
        for net in self.nets:
            for g in net.grads().values():
                g.fill(0)

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        slots = self.slots[0]
        wanted = STATE_SLOTS[self.config.name]
        return {
            name: {s: v.copy() for s, v in slots.get(name, {}).items() if s in wanted}
            for name in self.nets[0].params
        }

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        for net, own in zip(self.nets, self.slots, strict=True):
            for name, p in net.params.items():
                given = slots.get(name, {})
                if given:
                    own[name] = {s: np.array(v, dtype=p.dtype) for s, v in given.items()}
