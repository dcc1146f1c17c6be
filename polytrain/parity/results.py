"""What a comparison produced: the runs, the pairwise differences, the tolerances they
were held to. Plain data, shared by the harness and the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from polytrain.parity.lockstep import LockstepResult


@dataclass(frozen=True)
class Tolerances:
    """What "the same numbers" means for a comparison: ``step_loss`` bounds the lockstep
    per-step loss difference over ``parity_steps`` steps; ``grad`` the lockstep relative
    gradient difference of every parameter at every step (None: by precision,
    :data:`GRAD_TOLERANCES`); ``test_accuracy_points`` (None: report only) bounds the free
    runs' final test-accuracy difference."""

    step_loss: float = 1e-4
    parity_steps: int = 200
    test_accuracy_points: float | None = None
    diverged_at: float = 1e-4
    grad: float | None = None

    def grad_for(self, precision: str) -> float:
        """The gradient tolerance of a run in ``precision``."""
        return self.grad if self.grad is not None else GRAD_TOLERANCES.get(precision, 1e-1)


#: Default lockstep gradient tolerances (relative, see
#: :func:`polytrain.parity.lockstep.grad_differences`). float32: up to 1.7e-2 measured on
#: ResNet-18 (float32 cancellation in BatchNorm's backward, docs/semantics.md), ~1e-5 on
#: LeNet; float64: ~1e-14. A gradient 45 % off measures 0.45.
GRAD_TOLERANCES = {"fp64": 1e-8, "fp32": 5e-2}


@dataclass
class BackendRun:
    """What one backend's run produced."""

    backend: str
    framework_version: str
    devices: list[str]
    threads: dict[str, Any]
    step_losses: list[float]
    grad_norms: list[float | None]
    epochs: list[dict[str, Any]]
    seconds: float
    peak_rss_mb: float | None
    returncode: int = 0
    fast: bool | None = None  # the compiled mode it trained in (its start record), if known

    @property
    def final(self) -> dict[str, Any]:
        return self.epochs[-1] if self.epochs else {}

    @property
    def samples_per_second(self) -> float:
        rates = [e["samples_per_second"] for e in self.epochs]
        return float(np.median(rates)) if rates else 0.0

    @property
    def seconds_per_epoch(self) -> float:
        return float(np.mean([e["seconds"] for e in self.epochs])) if self.epochs else 0.0


@dataclass
class PairDiff:
    """The largest differences between two backends."""

    a: str
    b: str
    max_step_loss_diff: float
    max_step_loss_diff_at: int
    steps_compared: int
    test_accuracy_diff_points: float | None
    final_train_loss_diff: float | None
    diverged_at_step: int | None = None
    per_step: list[float] = field(default_factory=list)


@dataclass
class Comparison:
    recipe: dict[str, Any]
    tolerances: Tolerances
    reference: str
    runs: list[BackendRun]
    pairs: list[PairDiff]
    failures: list[str]
    lockstep: LockstepResult | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        runs = []
        for r in self.runs:
            d = asdict(r)
            d["samples_per_second"] = r.samples_per_second
            d["seconds_per_epoch"] = r.seconds_per_epoch
            runs.append(d)
        return {
            "recipe": self.recipe,
            "tolerances": asdict(self.tolerances),
            "reference": self.reference,
            "runs": runs,
            "pairs": [asdict(p) for p in self.pairs],
            "lockstep": self.lockstep.to_dict() if self.lockstep else None,
            "failures": self.failures,
            "ok": self.ok,
        }
