"""The canonical update rules of :mod:`polytrain.neutral.optim` as one pure function over
a replica's parameters (:func:`update`), jit-compiled, and the :class:`JaxOptimizer` that
holds each replica's slots under polytrain's names (``momentum_buffer``, ``sum``,
``exp_avg``, ``exp_avg_sq``), so that a run resumes across backends.

Slots start at zero: PyTorch's first momentum step (``buf = g``) and its zero-initialised
adagrad and adam slots are the same values. The step's scalars (lr, adam's bias
corrections) are computed on the host in Python floats, as PyTorch does, and passed in,
so a new learning rate or step recompiles nothing.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from polytrain.backend.model import Model
from polytrain.neutral.optim import STATE_SLOTS, Optimizer, OptimizerConfig

from ._model import JaxModel, x64
from ._net import Array, State

Slots = dict[str, dict[str, Array]]


def update(
    config: OptimizerConfig,
    decay: dict[str, float],
    params: State,
    grads: State,
    slots: Slots,
    scalars: dict[str, Array],
) -> tuple[State, Slots]:
    """New parameters and slots after one step (pure; ``scalars``: lr, adam's step size
    ``lr / (1 - b1**t)`` and ``sqrt(1 - b2**t)``)."""
    new_params, new_slots = {}, {}
    lr = scalars["lr"]
    for name, p in params.items():
        g = grads[name] + decay[name] * p if decay[name] else grads[name]
        st = slots[name]
        if config.name == "sgd":
            p, st = p - lr * g, {}
        elif config.name == "momentum":
            buf = config.momentum * st["momentum_buffer"] + g
            p, st = p - lr * buf, {"momentum_buffer": buf}
        elif config.name == "adagrad":
            total = st["sum"] + g * g
            p, st = p - lr * g / (jnp.sqrt(total) + config.epsilon), {"sum": total}
        else:
            b1, b2 = config.betas
            m = b1 * st["exp_avg"] + (1 - b1) * g
            v = b2 * st["exp_avg_sq"] + (1 - b2) * g * g
            denom = jnp.sqrt(v) / scalars["bias2_sqrt"] + config.epsilon
            p, st = p - scalars["step_size"] * m / denom, {"exp_avg": m, "exp_avg_sq": v}
        new_params[name], new_slots[name] = p, st
    return new_params, new_slots


class JaxOptimizer(Optimizer):
    """One set of slots per replica, updated by one compiled program per replica."""

    def __init__(self, model: Model, config: OptimizerConfig, compiled: bool) -> None:
        super().__init__(config)
        self.model = JaxModel.of(model)
        self.model.optimizer = self
        names = list(self.model.params[0])
        self.decay = {name: config.decay_for(name) for name in names}
        self.slots: list[Slots] = [self._zeros(i) for i in range(model.num_devices)]

        def program(params: State, grads: State, slots: Slots, scalars: dict[str, Array]) -> Any:
            return update(config, self.decay, params, grads, slots, scalars)

        self.program = jax.jit(program) if compiled else program

    def _zeros(self, replica: int) -> Slots:
        params = self.model.params[replica]
        wanted = STATE_SLOTS[self.config.name]
        with x64():
            return {n: {s: jnp.zeros_like(p) for s in wanted} for n, p in params.items()}

    def scalars(self, t: int | None = None) -> dict[str, Array]:
        """This step's host-computed scalars, in the model's dtype."""
        t = self.step_count + 1 if t is None else t
        b1, b2 = self.config.betas
        values = {
            "lr": self.lr,
            "step_size": self.lr / (1 - b1**t),
            "bias2_sqrt": math.sqrt(1 - b2**t),
        }
        return {k: np.asarray(v, dtype=self.model.dtype) for k, v in values.items()}

    def step(self) -> None:
        m = self.model
        with x64():
            committed = m.commit_update(self)
            if not committed:
                scalars = self.scalars()
                for i, grads in enumerate(m.grads):
                    if grads is not None:
                        m.params[i], self.slots[i] = self.program(
                            m.params[i], grads, self.slots[i], scalars
                        )
        self.step_count += 1

    def zero_grad(self) -> None:
        self.model.zero_grads(one_backward=False)

    def zero_grad_for_one_backward(self) -> None:
        self.model.zero_grads(one_backward=True)

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        if self.step_count == 0:  # no slot exists before the first step (PyTorch's)
            return {name: {} for name in self.model.params[0]}
        return {
            name: {s: np.array(v) for s, v in slots.items()}
            for name, slots in self.slots[0].items()
        }

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        m = self.model
        with x64():
            for i, own in enumerate(self.slots):
                device = m.devices[i].device
                for name, given in slots.items():
                    if name in own and given:
                        own[name] = {
                            s: jax.device_put(np.asarray(v, dtype=m.dtype), device)
                            for s, v in given.items()
                            if s in own[name]
                        }
