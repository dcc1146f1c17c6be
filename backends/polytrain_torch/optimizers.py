"""torch optimizers for the Paddle and MXNet rules that torch.optim has not, exactly.

``polytrain convert --optimizer`` ports these rules' state into them (the output names the
class): torch.optim's own classes put eps elsewhere, which no conversion of the state undoes.
Their state slots are torch.optim's where they mean the same (``exp_avg``, ``exp_inf``,
``square_avg``, ``grad_avg``, ``step``); RMSprop's ``velocity`` holds the learning rate
inside (torch's ``momentum_buffer`` does not).

==================  ==============================  ===================================
class               rule of                         update (g with weight decay added)
==================  ==============================  ===================================
RMSpropEpsInSqrt    Paddle RMSProp, MXNet RMSProp   sq = rho sq + (1 - rho) g^2;
                    (centered: Graves)              (centered) ga = rho ga + (1 - rho) g;
                                                    d = sqrt(sq - ga^2 + eps);
                                                    v = momentum v + lr g / d; p -= v
AdamaxEpsOnNorm     Paddle Adamax                   m = b1 m + (1 - b1) g;
                                                    u = max(b2 u + eps, |g|);
                                                    p -= lr / (1 - b1^t) m / u
AdamEpsUncorrected  MXNet Adam                      m, v as Adam; c = sqrt(1 - b2^t);
                                                    p -= lr c / (1 - b1^t) m / (sqrt(v) + eps)
==================  ==============================  ===================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


class _Elementwise(torch.optim.Optimizer):
    """A per-element rule: ``_update(p, g, state, group)`` for every parameter with a
    gradient (weight decay added to it), ``state["step"]`` counted first."""

    slots: tuple[str, ...] = ()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0)
                for slot in self.slots:
                    if slot not in state:
                        state[slot] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                self._update(p, g, state, group)
        return loss

    def _update(self, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any],
                group: dict[str, Any]) -> None:  # fmt: skip
        raise NotImplementedError


class RMSpropEpsInSqrt(_Elementwise):
    """RMSProp with eps inside the square root and the learning rate inside the velocity
    (Paddle's ``RMSProp``, MXNet's ``RMSProp``; ``centered``: Graves's)."""

    slots = ("square_avg", "grad_avg", "velocity")

    def __init__(self, params: Params, lr: float = 1e-2, rho: float = 0.95, eps: float = 1e-6,
                 momentum: float = 0.0, centered: bool = False,
                 weight_decay: float = 0.0) -> None:  # fmt: skip
        defaults = {"lr": lr, "rho": rho, "eps": eps, "momentum": momentum,
                    "centered": centered, "weight_decay": weight_decay}  # fmt: skip
        super().__init__(params, defaults)

    def _update(self, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any],
                group: dict[str, Any]) -> None:  # fmt: skip
        rho = group["rho"]
        square_avg = state["square_avg"].mul_(rho).addcmul_(g, g, value=1 - rho)
        if group["centered"]:
            grad_avg = state["grad_avg"].mul_(rho).add_(g, alpha=1 - rho)
            denom = square_avg.addcmul(grad_avg, grad_avg, value=-1).add_(group["eps"]).sqrt_()
        else:
            denom = square_avg.add(group["eps"]).sqrt_()
        velocity = state["velocity"].mul_(group["momentum"])
        velocity.addcdiv_(g, denom, value=group["lr"])
        p.sub_(velocity)


class AdamaxEpsOnNorm(_Elementwise):
    """Adamax with eps added to the decayed norm, ``max(b2 * u + eps, |g|)`` (Paddle's
    ``Adamax``); torch's adds it to ``|g|``."""

    slots = ("exp_avg", "exp_inf")

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:  # fmt: skip
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})  # fmt: skip

    def _update(self, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any],
                group: dict[str, Any]) -> None:  # fmt: skip
        b1, b2 = group["betas"]
        exp_avg = state["exp_avg"].lerp_(g, 1 - b1)
        exp_inf = state["exp_inf"]
        torch.maximum(exp_inf.mul_(b2).add_(group["eps"]), g.abs(), out=exp_inf)
        step = float(state["step"])
        p.addcdiv_(exp_avg, exp_inf, value=-group["lr"] / (1 - b1**step))


class AdamEpsUncorrected(_Elementwise):
    """Adam with eps added to the uncorrected ``sqrt(v)`` (MXNet's ``Adam``); torch's adds
    it after dividing by ``sqrt(1 - b2**t)``."""

    slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, params: Params, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:  # fmt: skip
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})  # fmt: skip

    def _update(self, p: torch.Tensor, g: torch.Tensor, state: dict[str, Any],
                group: dict[str, Any]) -> None:  # fmt: skip
        b1, b2 = group["betas"]
        exp_avg = state["exp_avg"].lerp_(g, 1 - b1)
        exp_avg_sq = state["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        step = float(state["step"])
        size = group["lr"] * math.sqrt(1 - b2**step) / (1 - b1**step)
        p.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(group["eps"]), value=-size)


VARIANT_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "eps-in-sqrt": RMSpropEpsInSqrt,
    "eps-on-decayed-norm": AdamaxEpsOnNorm,
    "eps-uncorrected": AdamEpsUncorrected,
}
"""The class of each rule variant (``polytrain.backend.optimizer_file.VARIANTS``)."""
