"""An optimizer's state as a framework's own file holds it, in canonical terms.

A plugin's :meth:`~polytrain.backend.native_format.NativeFormat.read_optimizer` reads its
framework's optimizer file (the one written next to the weights of the same run) into an
:class:`OptimizerFile`: the update rule, every hyperparameter that rule uses, the number of
updates taken and, per parameter, the canonical state slots (torch.optim's names:
``momentum_buffer``, ``sum``, ``exp_avg``, ``exp_avg_sq``, ``exp_inf``, ``square_avg``,
``acc_delta``, ``grad_avg``; ``velocity`` where the learning rate is inside the buffer).
Where the framework's rule differs from torch.optim's in a way no state conversion can
undo (where eps goes), ``variant`` names the framework's rule. A reader names parameters
as the weights file does and keeps its layout; :mod:`polytrain.io.optimizer_state` then
maps them to canonical names and layout, and a format's ``encode_optimizer`` writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytrain.errors import ConfigError

RULES = ("sgd", "momentum", "adam", "adamw", "adamax", "adagrad", "adadelta", "rmsprop", "lamb")
"""``adamw`` is ``adam`` with decoupled weight decay (``p -= lr * wd * p`` before the step);
``lamb`` is only named, to be refused (torch has no Lamb)."""
VARIANTS = {
    "eps-in-sqrt": "rmsprop: lr * g / sqrt(square_avg + eps), lr inside the velocity",
    "eps-on-decayed-norm": "adamax: exp_inf = max(beta2 * exp_inf + eps, |g|)",
    "eps-uncorrected": "adam: lr * sqrt(1 - b2**t) / (1 - b1**t) * m / (sqrt(v) + eps)",
}
"""The framework rules that differ from torch.optim's where eps goes."""
SETTINGS = ("optimizer", "lr", "momentum", "betas", "eps", "weight_decay", "nesterov", "rho",
            "centered", "scheduler", "order")  # fmt: skip
"""What ``--optimizer-setting KEY=VALUE`` may give (``optimizer`` is the rule; ``order`` a
file naming the parameters in the optimizer's order, where the optimizer file does not;
``scheduler`` the learning-rate scheduler as the run's script built it)."""
GENERAL = ("optimizer", "scheduler", "order")
"""the settings that are no hyperparameter of a rule"""
NEEDED: dict[str, tuple[str, ...]] = {
    "sgd": ("lr", "weight_decay"),
    "momentum": ("lr", "momentum", "weight_decay", "nesterov"),
    "adam": ("lr", "betas", "eps", "weight_decay"),
    "adamw": ("lr", "betas", "eps", "weight_decay"),
    "adamax": ("lr", "betas", "eps", "weight_decay"),
    "adagrad": ("lr", "eps", "weight_decay"),
    "adadelta": ("lr", "rho", "eps", "weight_decay"),
    "rmsprop": ("lr", "rho", "eps", "momentum", "centered", "weight_decay"),
}
"""The hyperparameters each rule uses (``rho``: the decay of the squared-gradient average,
torch's ``alpha`` for RMSprop)."""


@dataclass
class OptimizerFile:
    """The state of one optimizer: ``slots`` has one entry per parameter it updates (in
    the model's parameter order once mapped), possibly empty (plain SGD)."""

    rule: str
    hyper: dict[str, Any]
    """lr, momentum, betas, eps, weight_decay, nesterov, rho, centered: those ``rule``
    uses (:data:`NEEDED`)"""
    step: int
    slots: dict[str, dict[str, np.ndarray]]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """parameter name -> shape, for every key of ``slots``"""
    master_weights: dict[str, np.ndarray] = field(default_factory=dict)
    """full-precision copies of low-precision parameters, where the file keeps them"""
    notes: list[str] = field(default_factory=list)
    variant: str = ""
    """the framework's rule where no state conversion makes torch.optim's the same
    (:data:`VARIANTS`), else empty"""
    scheduler: dict[str, Any] | None = None
    """the learning-rate schedule to continue (``kind``, its settings, ``last_epoch``:
    :mod:`polytrain.backend.lr_schedule`), or None for a constant rate"""


def parse_settings(items: list[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``["lr=0.01", "betas=0.9,0.999", "optimizer=adamw"]`` (or a dict) as typed values."""
    if items is None:
        return {}
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"Optimizer setting {item!r} is not KEY=VALUE.")
            pairs.append((key.strip(), value.strip()))
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key not in SETTINGS:
            raise ConfigError(
                f"Unknown optimizer setting {key!r}; use one of {', '.join(SETTINGS)}."
            )
        try:
            out[key] = _typed(key, value)
        except (TypeError, ValueError):
            raise ConfigError(f"Optimizer setting {key}={value!r} is not valid.") from None
    return out


def _typed(key: str, value: Any) -> Any:
    if key == "optimizer":
        if str(value).lower() not in RULES:
            raise ValueError(value)
        return str(value).lower()
    if key in ("order", "scheduler"):
        return str(value)
    if key in ("nesterov", "centered"):
        if isinstance(value, bool):
            return value
        if str(value).lower() not in ("true", "false", "1", "0"):
            raise ValueError(value)
        return str(value).lower() in ("true", "1")
    if key == "betas":
        parts = value.split(",") if isinstance(value, str) else list(value)
        if len(parts) != 2:
            raise ValueError(value)
        return (float(parts[0]), float(parts[1]))
    return float(value)


def resolve_hyper(
    rule: str,
    recorded: Mapping[str, Any],
    defaults: Mapping[str, Any],
    given: Mapping[str, Any],
    source: str,
    framework: str,
) -> tuple[dict[str, Any], list[str]]:
    """The hyperparameters of ``rule``: what the file records, else what the user gives,
    else the framework's default (with a note saying so). A given value that contradicts
    the file, or a needed one that is neither recorded, given nor defaulted, is an error."""
    needed = NEEDED[rule]
    unused = [k for k in given if k not in (*needed, *GENERAL)]
    if unused:
        raise ConfigError(
            f"The optimizer setting {unused[0]} does not apply to {rule} (the state of "
            f"{source}): drop it or check the file."
        )
    hyper: dict[str, Any] = {}
    assumed = []
    for key in needed:
        if key in recorded:
            if key in given and not _same(given[key], recorded[key]):
                raise ConfigError(
                    f"{source} records {key}={recorded[key]!r}, the setting says "
                    f"{given[key]!r}: drop the setting or check the file."
                )
            hyper[key] = recorded[key]
        elif key in given:
            hyper[key] = given[key]
        elif key in defaults:
            hyper[key] = defaults[key]
            assumed.append(f"{key}={defaults[key]!r}")
        else:
            value = "true|false" if key in ("nesterov", "centered") else "VALUE"
            raise ConfigError(
                f"{source} does not record the {key} of the run: give it with "
                f"--optimizer-setting {key}={value} (Python: settings={{{key!r}: ...}})."
            )
    notes = []
    if assumed:
        notes.append(
            f"{framework} defaults assumed (not recorded in {source}; override with "
            f"--optimizer-setting): {', '.join(assumed)}"
        )
    return hyper, notes


def _same(a: Any, b: Any) -> bool:
    return bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=1e-6))
