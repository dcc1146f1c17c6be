"""A ``torch.optim`` state dict (and lr_scheduler state dict) from canonical optimizer state.

Built by torch itself: the optimizer the rule names is constructed over stand-in tensors of
the parameters' shapes, in the model's parameter order, given the state, and its
``state_dict()`` saved, so that ``torch.optim.<Rule>(model.parameters(), ...)
.load_state_dict(torch.load(path))`` takes it (its hyperparameters come with it). A rule
torch.optim has not exactly (``state.variant``) goes to its class in ``optimizers``. A
schedule is stepped to its ``last_epoch`` on the same optimizer, whose rate is then the
file's.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import torch

from polytrain.backend.optimizer_file import OptimizerFile

from .optimizers import VARIANT_CLASSES

STEPPED = ("adam", "adamw", "adamax", "adagrad", "adadelta", "rmsprop")
"""the rules whose torch state has a ``step``"""


def optimizer_class(state: OptimizerFile) -> type[torch.optim.Optimizer]:
    """The class that continues ``state``."""
    if state.variant:
        return VARIANT_CLASSES[state.variant]
    return {
        "sgd": torch.optim.SGD,
        "momentum": torch.optim.SGD,
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "adamax": torch.optim.Adamax,
        "adagrad": torch.optim.Adagrad,
        "adadelta": torch.optim.Adadelta,
        "rmsprop": torch.optim.RMSprop,
    }[state.rule]


def _arguments(state: OptimizerFile) -> dict[str, Any]:
    """The class's constructor arguments (torch's names)."""
    h = state.hyper
    out: dict[str, Any] = {"lr": h["lr"], "weight_decay": h["weight_decay"]}
    if state.rule in ("sgd", "momentum"):
        out.update(momentum=h.get("momentum", 0.0), nesterov=bool(h.get("nesterov", False)))
    if "betas" in h:
        out["betas"] = tuple(h["betas"])
    if "eps" in h:
        out["eps"] = h["eps"]
    if state.rule in ("adadelta", "rmsprop"):
        out["rho" if state.variant or state.rule == "adadelta" else "alpha"] = h["rho"]
    if state.rule == "rmsprop":
        out.update(momentum=h["momentum"], centered=bool(h["centered"]))
    return out


def _optimizer(state: OptimizerFile) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    params = [torch.zeros(state.shapes[name], requires_grad=True) for name in state.slots]
    return optimizer_class(state)(params, **_arguments(state)), params


def _filled(state: OptimizerFile) -> torch.optim.Optimizer:
    """The optimizer with the state, its schedule stepped to ``last_epoch``."""
    opt, params = _optimizer(state)
    if state.scheduler is not None:
        _scheduler(opt, state.scheduler)
        for group in opt.param_groups:
            group["lr"] = state.hyper["lr"]  # the file's rate, not torch's recursion's
    for p, slots in zip(params, state.slots.values(), strict=True):
        entry = opt.state[p]
        for slot, value in slots.items():
            entry[slot] = torch.from_numpy(np.array(value, dtype=np.float32))
        if state.rule in STEPPED:
            entry["step"] = torch.tensor(float(state.step), dtype=torch.float32)
    return opt


def encode_optimizer(state: OptimizerFile) -> bytes:
    """``torch.save(optimizer.state_dict())`` bytes for ``state``; its notes say which
    class loads it."""
    cls = optimizer_class(state)
    module = "polytrain_torch.optimizers" if state.variant else "torch.optim"
    state.notes.append(f"load the optimizer state into {module}.{cls.__name__}")
    return _saved(_filled(state).state_dict())


def encode_scheduler(state: OptimizerFile) -> bytes:
    """``torch.save(scheduler.state_dict())`` bytes for ``state.scheduler``."""
    assert state.scheduler is not None
    opt, _ = _optimizer(state)
    scheduler = _scheduler(opt, state.scheduler)
    scheduler._last_lr = [state.hyper["lr"]] * len(opt.param_groups)
    state.notes.append(
        f"load the scheduler state into torch.optim.lr_scheduler.{type(scheduler).__name__}, "
        "built before the optimizer's state is loaded"
    )
    return _saved(scheduler.state_dict())


def _scheduler(opt: torch.optim.Optimizer, schedule: dict[str, Any]) -> Any:
    """The torch scheduler of ``schedule`` on ``opt`` (rate ``base_lr``), stepped
    ``last_epoch`` times."""
    for group in opt.param_groups:
        group["lr"] = schedule["base_lr"]
    sched = torch.optim.lr_scheduler
    kind = schedule["kind"]
    if kind == "step":
        out: Any = sched.StepLR(opt, schedule["step_size"], schedule["gamma"])
    elif kind == "multistep":
        out = sched.MultiStepLR(opt, list(schedule["milestones"]), schedule["gamma"])
    elif kind == "exponential":
        out = sched.ExponentialLR(opt, schedule["gamma"])
    elif kind == "cosine":
        out = sched.CosineAnnealingLR(opt, schedule["T_max"], schedule["eta_min"])
    else:
        out = sched.PolynomialLR(opt, schedule["total_iters"], schedule["power"])
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()"
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(int(schedule["last_epoch"])):
            out.step()
    return out


def _saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()
