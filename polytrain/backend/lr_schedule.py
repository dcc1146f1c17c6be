"""A learning-rate schedule in canonical terms: the torch.optim.lr_scheduler that goes on.

A schedule is a dict: ``kind``, its settings (torch's names), ``base_lr`` and
``last_epoch`` (the scheduler steps taken: the next optimizer step uses
``lr_at(schedule, last_epoch)``):

============  =================================  ===========================================
kind          torch.optim.lr_scheduler           lr after e scheduler steps (b: base_lr)
============  =================================  ===========================================
step          StepLR(step_size, gamma)           b * gamma ** (e // step_size)
multistep     MultiStepLR(milestones, gamma)     b * gamma ** bisect_right(milestones, e)
exponential   ExponentialLR(gamma)               b * gamma ** e
cosine        CosineAnnealingLR(T_max, eta_min)  eta_min + (b - eta_min) * (1 + cos(pi e/T_max))/2
polynomial    PolynomialLR(total_iters, power)   b * (1 - min(e, total_iters)/total_iters) ** power
============  =================================  ===========================================

The plugins read their framework's scheduler state into this form (Paddle's from the user's
constructor call, checked against the file's last rate: polytrain_paddle._lr_schedule;
MXNet's from the pickled scheduler).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from typing import Any

from polytrain.errors import ConfigError

KINDS = ("step", "multistep", "exponential", "cosine", "polynomial")
CONSTANT = "constant"
"""``--optimizer-setting scheduler=constant``: go on at the file's last rate."""


def lr_at(schedule: Mapping[str, Any], epoch: int) -> float:
    """The rate after ``epoch`` scheduler steps (closed form)."""
    kind, base = schedule["kind"], float(schedule["base_lr"])
    if kind == "step":
        return base * schedule["gamma"] ** (epoch // schedule["step_size"])
    if kind == "multistep":
        return base * schedule["gamma"] ** bisect_right(list(schedule["milestones"]), epoch)
    if kind == "exponential":
        return base * schedule["gamma"] ** epoch
    if kind == "cosine":
        eta = float(schedule["eta_min"])
        return eta + (base - eta) * (1 + math.cos(math.pi * epoch / schedule["T_max"])) / 2
    if kind == "polynomial":
        total = schedule["total_iters"]
        return base * (1 - min(epoch, total) / total) ** schedule["power"]
    raise ConfigError(f"Unknown schedule kind {kind!r}.")
