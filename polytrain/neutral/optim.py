"""Optimizers: one configuration, one update formula (PyTorch's), a numpy reference.

Every backend applies exactly these updates, with the weight decay added to the
gradient as L2 (``g = grad + weight_decay * p``) before the rule:

==========  ====================================================================
sgd         ``p -= lr * g``
momentum    ``buf = momentum * buf + g``; ``p -= lr * buf`` (lr outside the buffer)
adagrad     ``sum += g * g``; ``p -= lr * g / (sqrt(sum) + eps)`` (eps 1e-10)
adam        ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g*g``;
            ``p -= lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)`` (eps 1e-8)
==========  ====================================================================

Optimizer state is exchanged in canonical form: per parameter ``momentum_buffer``,
``sum``, ``exp_avg``, ``exp_avg_sq``, and one global ``step``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from polytrain.errors import ConfigError

OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam")
STATE_SLOTS: dict[str, tuple[str, ...]] = {
    "sgd": (),
    "momentum": ("momentum_buffer",),
    "adagrad": ("sum",),
    "adam": ("exp_avg", "exp_avg_sq"),
}


@dataclass(frozen=True)
class OptimizerConfig:
    """An optimizer, the same on every backend."""

    name: str = "momentum"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float | None = None
    per_layer_weight_decay: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(
                f"Unknown optimizer {self.name!r}. Choose one of: {', '.join(OPTIMIZERS)}."
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"Learning rate must be a positive number, got {self.lr!r}.")
        if self.weight_decay < 0 or not math.isfinite(self.weight_decay):
            raise ConfigError(f"Weight decay must be >= 0, got {self.weight_decay!r}.")
        for layer, decay in self.per_layer_weight_decay.items():
            if not (decay >= 0 and math.isfinite(decay)):
                raise ConfigError(f"Weight decay of layer {layer!r} must be >= 0, got {decay!r}.")
        if self.name == "momentum" and not 0 <= self.momentum < 1:
            raise ConfigError(f"Momentum must be in [0, 1), got {self.momentum!r}.")

    @property
    def epsilon(self) -> float:
        """The eps of the rule (adagrad 1e-10, adam 1e-8, as in PyTorch)."""
        if self.eps is not None:
            return self.eps
        return 1e-10 if self.name == "adagrad" else 1e-8

    def decay_for(self, name: str) -> float:
        """Weight decay for a canonical parameter name: per-layer prefix wins, longest first."""
        for prefix in sorted(self.per_layer_weight_decay, key=len, reverse=True):
            if name == prefix or name.startswith(prefix + "."):
                return self.per_layer_weight_decay[prefix]
        return self.weight_decay

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OptimizerConfig:
        data = dict(data)
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        return cls(**data)


class Optimizer(ABC):
    """A backend's optimizer over every replica of one model."""

    def __init__(self, config: OptimizerConfig) -> None:
        self.config = config
        self.lr = config.lr
        self.step_count = 0

    @abstractmethod
    def step(self) -> None:
        """Apply one update to every replica from the (already synchronised) gradients."""

    @abstractmethod
    def zero_grad(self) -> None:
        """Reset every replica's gradients to zero (or none)."""

    def zero_grad_for_one_backward(self) -> None:
        """Ready the gradients for a step in which each replica runs one forward, recorded
        after this call, and one backward of it; call :meth:`gradients_done` after those
        backward calls. The gradients then equal what :meth:`zero_grad` and the same calls
        give. By default it is :meth:`zero_grad`; a backend may let that one backward
        overwrite the gradients instead of adding to zeros (MXNet, docs/performance.md)."""
        self.zero_grad()

    def gradients_done(self) -> None:
        """The backward calls of a step readied by :meth:`zero_grad_for_one_backward` have
        run: a backend whose backward overwrote the gradients zeroes those it did not
        reach. Nothing to do by default."""
        return None

    @abstractmethod
    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        """Per canonical parameter name, its state slots as numpy (canonical layout)."""

    @abstractmethod
    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        """Load state slots produced by :meth:`get_slots` on any backend."""

    def set_lr(self, lr: float) -> None:
        """Change the learning rate for the next steps."""
        self.lr = float(lr)

    def state_dict(self) -> dict[str, Any]:
        """Canonical optimizer state: config, step, lr and slots."""
        return {
            "config": self.config.to_dict(),
            "step": self.step_count,
            "lr": self.lr,
            "slots": self.get_slots(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["config"]["name"] != self.config.name:
            raise ConfigError(
                f"Optimizer state is for {state['config']['name']!r}, this run uses "
                f"{self.config.name!r}. Use the same --optimizer or start fresh."
            )
        self.step_count = int(state["step"])
        self.lr = float(state["lr"])
        self.set_slots(state["slots"])


def numpy_step(
    config: OptimizerConfig,
    params: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    slots: dict[str, dict[str, np.ndarray]],
    step: int,
    lr: float | None = None,
) -> int:
    """Reference update in float64 numpy, in place on ``params`` and ``slots``; returns step+1."""
    lr = config.lr if lr is None else lr
    step += 1
    b1, b2 = config.betas
    eps = config.epsilon
    for name, p in params.items():
        g = grads[name].astype(np.float64) + config.decay_for(name) * p
        st = slots.setdefault(name, {})
        if config.name == "sgd":
            p -= lr * g
        elif config.name == "momentum":
            buf = st.get("momentum_buffer")
            buf = g.copy() if buf is None else config.momentum * buf + g
            st["momentum_buffer"] = buf
            p -= lr * buf
        elif config.name == "adagrad":
            st["sum"] = st.get("sum", np.zeros_like(p)) + g * g
            p -= lr * g / (np.sqrt(st["sum"]) + eps)
        else:
            st["exp_avg"] = b1 * st.get("exp_avg", np.zeros_like(p)) + (1 - b1) * g
            st["exp_avg_sq"] = b2 * st.get("exp_avg_sq", np.zeros_like(p)) + (1 - b2) * g * g
            denom = np.sqrt(st["exp_avg_sq"]) / math.sqrt(1 - b2**step) + eps
            p -= lr / (1 - b1**step) * st["exp_avg"] / denom
    return step
