"""Precision: the precisions, the dynamic loss scaler, and what a backend reports it supports
(the policy a step follows is :mod:`polytrain.training.mixed_precision`).

``fp32`` changes nothing (every hook below is the identity). ``fp64`` is the parity
mode: the model is built in float64 (parameters, activations, gradients, optimizer
state) and inputs are cast to it, so the frameworks' kernels differ by ~1e-16 instead of
~1e-7 and free runs of different frameworks stay together over a whole run, where in
float32 training chaos amplifies the rounding differences within a few dozen steps
(docs/semantics.md). It is slower, and meant for checking a port, not for speed.
``bf16`` runs forward passes
under the backend's autocast; bfloat16 keeps float32's exponent range, so gradients need no
scaling. ``fp16`` adds a dynamic :class:`LossScaler` (the loss-scaling contract in
docs/architecture.md): the loss is multiplied by the scale before backward; once gradients
are summed over replicas and processes, the backend divides them by the scale and says
whether all are finite; a step with inf/nan is skipped and the scale halves, 2000 good steps
in a row double it. The
defaults are PyTorch's GradScaler's, the same on every backend.

The scaler is plain Python (no framework), so its state is a small dict the checkpoint
stores. Which precision works where is each backend's :meth:`Backend.precision_support`,
measured by a tiny forward and backward pass, so a precision that would silently run in
float32 (Paddle's ``auto_cast`` on a CPU) is reported as unsupported instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polytrain.errors import BackendError, ConfigError

PRECISIONS = ("fp32", "bf16", "fp16", "fp64")
PARAM_DTYPES = ("float32", "float64")  # what Backend.build_model(dtype=) accepts
MAX_SCALE = 2.0**127  # float32 overflows at 2**128
SCALED = frozenset({"fp16"})  # precisions whose gradients can underflow without a loss scale


@dataclass(frozen=True)
class PrecisionSupport:
    """Whether a precision trains on a device kind here, and why (not)."""

    precision: str
    supported: bool
    detail: str = ""

    def __str__(self) -> str:
        state = "yes" if self.supported else "no"
        return f"{self.precision}: {state}" + (f" ({self.detail})" if self.detail else "")


class LossScaler:
    """Dynamic loss scaling, framework-free: multiply the loss by :attr:`scale`; after
    backward call :meth:`update` with whether every gradient was finite."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ConfigError(f"init_scale must be a positive number, got {init_scale!r}.")
        if growth_factor <= 1.0 or not 0.0 < backoff_factor < 1.0:
            raise ConfigError(
                f"Need growth_factor > 1 and 0 < backoff_factor < 1, got {growth_factor!r} "
                f"and {backoff_factor!r}."
            )
        if growth_interval < 1:
            raise ConfigError(f"growth_interval must be >= 1, got {growth_interval!r}.")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0  # finite steps since the last change of scale
        self.skipped = 0  # steps skipped over the whole run

    def update(self, finite: bool) -> None:
        """Back off after a non-finite step; grow after ``growth_interval`` finite ones."""
        if not finite:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            grown = self.scale * self.growth_factor
            if grown <= MAX_SCALE:  # the scaled loss is float32: never grow into its inf
                self.scale = grown
            self.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "good_steps": self.good_steps,
            "skipped": self.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            scale = float(state["scale"])
            good = int(state.get("good_steps", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"Not a loss scaler state: {state!r} ({exc}).") from None
        fresh = LossScaler(  # validates the hyper-parameters as the constructor does
            scale,
            float(state.get("growth_factor", self.growth_factor)),
            float(state.get("backoff_factor", self.backoff_factor)),
            int(state.get("growth_interval", self.growth_interval)),
        )
        fresh.good_steps, fresh.skipped = good, int(state.get("skipped", 0))
        vars(self).update(vars(fresh))

    def __repr__(self) -> str:
        return f"LossScaler(scale={self.scale:g}, good_steps={self.good_steps})"


def check_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise ConfigError(f"Unknown precision {name!r}; use one of {', '.join(PRECISIONS)}.")
    return name


def param_dtype(precision: str) -> str:
    """The dtype models are built in for ``precision`` (float64 only for fp64: the mixed
    precisions keep float32 parameters and compute low-precision under autocast)."""
    return "float64" if check_precision(precision) == "fp64" else "float32"


def check_dtype(dtype: str) -> str:
    """A parameter dtype :meth:`Backend.build_model` accepts, or a clear error."""
    if dtype not in PARAM_DTYPES:
        raise BackendError(
            f"Models are built in {' or '.join(PARAM_DTYPES)}, not {dtype!r}; for bf16/fp16 "
            "use --precision (autocast keeps float32 parameters)."
        )
    return dtype


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty elsewhere): whether it has
    bf16/fp16 matmul units decides whether mixed precision is faster there."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
