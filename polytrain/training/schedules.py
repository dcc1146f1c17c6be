"""Learning-rate schedules: pure functions of the global optimizer step, once for every backend.

A schedule is written ``NAME[:KEY=VALUE,...]`` (the recipe's ``schedule`` field, the CLI's
``--schedule``), e.g. ``cosine:warmup=100,min_lr=0.001`` or ``multistep:milestones=30/60``.
``lr`` is the recipe's learning rate, ``k`` the 0-based optimizer step, ``W`` the warm-up
steps and ``T`` the total steps (default: the run's, epochs x steps per epoch):

=============  ===========================================================================
``constant``   ``lr``
``step``       ``lr * gamma ** (k // step_size)``            (PyTorch's StepLR)
``multistep``  ``lr * gamma ** (number of milestones <= k)``  (PyTorch's MultiStepLR)
``cosine``     ``min_lr + (lr - min_lr) * (1 + cos(pi * (k - W) / (T - W))) / 2``, ``min_lr``
               from ``k >= T`` on (PyTorch's CosineAnnealingLR with ``T_max = T - W``,
               which would rise again after ``T``)
``onecycle``   PyTorch's OneCycleLR (two phases, cosine annealing), learning rate only:
               from ``max_lr / div_factor`` up to ``max_lr`` (default ``lr``) at step
               ``pct_start * T - 1``, then down to ``max_lr / div_factor / final_div_factor``
               at step ``T - 1``, and that value after it (PyTorch raises there)
=============  ===========================================================================

Warm-up (``warmup=W``, every schedule but ``onecycle``, whose first phase is one): for
``k < W`` the lr is ``lr * (k + 1) / W``; from ``k = W`` on, the formula above (``step``
and ``multistep`` count ``k`` from the start of the run). The schedule holds no state: a
resumed run's lr follows from the global step its checkpoint holds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from polytrain.errors import ConfigError

Value = int | float | tuple[int, ...]


def constant_lr(k: int, lr: float) -> float:
    """``lr`` at every step."""
    return lr


def step_lr(k: int, lr: float, step_size: int, gamma: float = 0.1) -> float:
    """``lr`` times ``gamma`` once every ``step_size`` steps."""
    return lr * gamma ** (k // step_size)


def multistep_lr(k: int, lr: float, milestones: tuple[int, ...], gamma: float = 0.1) -> float:
    """``lr`` times ``gamma`` at each milestone step reached."""
    return lr * gamma ** bisect.bisect_right(milestones, k)


def cosine_lr(k: int, lr: float, total: int, min_lr: float = 0.0, warmup: int = 0) -> float:
    """Half a cosine from ``lr`` at step ``warmup`` to ``min_lr`` at step ``total``."""
    if k >= total:
        return min_lr
    progress = (k - warmup) / (total - warmup)
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2


def one_cycle_lr(
    k: int,
    lr: float,
    total: int,
    max_lr: float | None = None,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> float:
    """PyTorch's OneCycleLR (``anneal_strategy="cos"``, two phases) at step ``k``."""
    peak = lr if max_lr is None else max_lr
    initial = peak / div_factor
    final = initial / final_div_factor
    if k >= total - 1:
        return final
    rise_end = pct_start * total - 1
    if k <= rise_end:
        start_step, end_step, start_lr, end_lr = 0.0, rise_end, initial, peak
    else:
        start_step, end_step, start_lr, end_lr = rise_end, total - 1.0, peak, final
    pct = (k - start_step) / (end_step - start_step)
    return end_lr + (start_lr - end_lr) / 2 * (math.cos(math.pi * pct) + 1)


@dataclass(frozen=True)
class Kind:
    """One schedule: its formula, its parameters' parsers and defaults."""

    formula: Callable[..., float]
    params: dict[str, Callable[[str, str], Value]]
    required: tuple[str, ...] = ()
    needs_total: bool = False
    warmup: bool = True


def _int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 and not (name == "warmup" and text.strip() == "0"):
        raise ConfigError(f"--schedule {name}={text!r}: give an integer >= 1.")
    return value


def _float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"--schedule {name}={text!r}: give a finite number >= 0.")
    return value


def _milestones(name: str, text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(t) for t in text.split("/"))
    except ValueError:
        steps = ()
    if not steps or min(steps) < 1 or list(steps) != sorted(set(steps)):
        raise ConfigError(
            f"--schedule {name}={text!r}: give increasing steps >= 1 separated by '/', e.g. 30/60."
        )
    return steps


KINDS: dict[str, Kind] = {
    "constant": Kind(constant_lr, {}),
    "step": Kind(step_lr, {"step_size": _int, "gamma": _float}, ("step_size",)),
    "multistep": Kind(multistep_lr, {"milestones": _milestones, "gamma": _float}, ("milestones",)),
    "cosine": Kind(cosine_lr, {"total": _int, "min_lr": _float}, needs_total=True),
    "onecycle": Kind(
        one_cycle_lr,
        {
            "total": _int,
            "max_lr": _float,
            "pct_start": _float,
            "div_factor": _float,
            "final_div_factor": _float,
        },
        needs_total=True,
        warmup=False,
    ),
}


@dataclass(frozen=True)
class Schedule:
    """A parsed, validated schedule: ``name``, its parameters and the warm-up steps."""

    name: str = "constant"
    params: dict[str, Value] = field(default_factory=dict)
    warmup: int = 0

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """``NAME[:KEY=VALUE,...]`` (see the module docstring) as a Schedule."""
        if not isinstance(text, str):
            raise ConfigError(f"--schedule must be text like 'cosine:warmup=100', got {text!r}.")
        name, _, rest = text.strip().partition(":")
        kind = KINDS.get(name.strip())
        if kind is None:
            raise ConfigError(f"Unknown --schedule {name!r}; use one of {', '.join(KINDS)}.")
        known = {**kind.params, **({"warmup": _int} if kind.warmup else {})}
        params: dict[str, Value] = {}
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, sep, value = (s.strip() for s in item.partition("="))
            if not sep or key not in known:
                raise ConfigError(
                    f"--schedule {text!r}: {item!r} is not KEY=VALUE with KEY one of "
                    f"{', '.join(known) or '(none)'} for {name}."
                )
            params[key] = known[key](key, value)
        missing = [k for k in kind.required if k not in params]
        if missing:
            raise ConfigError(f"--schedule {text!r}: {name} needs {', '.join(missing)}=...")
        warmup = params.pop("warmup", 0)
        assert isinstance(warmup, int)
        schedule = cls(name.strip(), params, warmup)
        schedule._check()
        return schedule

    def __str__(self) -> str:
        items = {**self.params, **({"warmup": self.warmup} if self.warmup else {})}
        text = ",".join(f"{k}={_text(v)}" for k, v in sorted(items.items()))
        return f"{self.name}:{text}" if text else self.name

    @property
    def kind(self) -> Kind:
        return KINDS[self.name]

    def with_warmup(self, steps: int) -> Schedule:
        """The same schedule with ``steps`` warm-up steps (the recipe's ``warmup_steps``)."""
        if steps == self.warmup or steps == 0:
            return self
        if not self.kind.warmup:
            raise ConfigError(
                f"--warmup-steps does not combine with --schedule {self.name}: its first "
                "phase is the warm-up (set pct_start instead)."
            )
        if self.warmup:
            raise ConfigError(
                f"--warmup-steps {steps} and --schedule {self} warmup={self.warmup} disagree: "
                "give the warm-up once."
            )
        return Schedule(self.name, dict(self.params), steps)

    def resolve(self, total_steps: int | None) -> Schedule:
        """The schedule with its total steps set (``total_steps``: the run's length) where
        it needs one and was given none; checked against it."""
        if not self.kind.needs_total or "total" in self.params:
            return self
        if total_steps is None:
            raise ConfigError(
                f"--schedule {self} needs the run's total steps: give total=N in the schedule."
            )
        resolved = Schedule(self.name, {**self.params, "total": total_steps}, self.warmup)
        try:
            resolved._check()
        except ConfigError as exc:
            raise ConfigError(
                f"{str(exc).rstrip('.')} (total={total_steps}: this run's epochs x steps per "
                "epoch; give total=N in the schedule, or train longer)."
            ) from None
        return resolved

    def lr_at(self, k: int, lr: float) -> float:
        """The learning rate of optimizer step ``k`` (0-based) for base rate ``lr``."""
        if k < self.warmup:
            return lr * (k + 1) / self.warmup
        if self.kind.needs_total and "total" not in self.params:
            raise ConfigError(f"--schedule {self} has no total steps yet (Schedule.resolve).")
        extra: dict[str, Any] = {"warmup": self.warmup} if self.name == "cosine" else {}
        return float(self.kind.formula(k, lr, **self.params, **extra))

    def _check(self) -> None:
        """One line for parameters that parse but do not make a schedule."""
        p = self.params
        total = p.get("total")
        if isinstance(total, int) and self.warmup >= total:
            raise ConfigError(
                f"--schedule {self}: warmup ({self.warmup}) must be below total ({total})."
            )
        if self.name == "onecycle":
            pct = p.get("pct_start", 0.3)
            assert isinstance(pct, float)
            if not 0 < pct < 1:
                raise ConfigError(f"--schedule {self}: pct_start must be in (0, 1), got {pct}.")
            if isinstance(total, int) and not 1 < pct * total < total:
                raise ConfigError(
                    f"--schedule {self}: pct_start * total must be in (1, total) so both "
                    f"phases have steps, got {pct * total:g}; raise total or pct_start."
                )
            for name in ("div_factor", "final_div_factor", "max_lr"):
                if name in p and p[name] == 0:
                    raise ConfigError(f"--schedule {self}: {name} must be > 0.")
        if self.name in ("step", "multistep") and p.get("gamma") == 0:
            raise ConfigError(f"--schedule {self}: gamma must be > 0.")


def _text(value: Value) -> str:
    if isinstance(value, tuple):
        return "/".join(str(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)
