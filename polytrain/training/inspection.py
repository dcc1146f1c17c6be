"""Looking inside a model while it trains: per-layer output and gradient statistics, and
the first layer whose output went non-finite."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from polytrain.backend.base import Backend, Model
from polytrain.backend.inspection import Inspection
from polytrain.errors import ConfigError


def array_stats(a: np.ndarray) -> dict[str, float | int]:
    """mean, std, max |x| over the finite values, and the count of NaN/Inf values."""
    flat = np.asarray(a, dtype=np.float64).ravel()
    finite = np.isfinite(flat)
    good = flat[finite]
    return {
        "mean": float(good.mean()) if good.size else float("nan"),
        "std": float(good.std()) if good.size else float("nan"),
        "max_abs": float(np.abs(good).max()) if good.size else float("nan"),
        "nonfinite": int(flat.size - int(finite.sum())),
    }


def parse_steps(text: str | None) -> Callable[[int], bool] | None:
    """Which global steps (1-based) to inspect: ``"1,50,200"`` or ``"every:100"``."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    try:
        if text.startswith("every:"):
            every = int(text.split(":", 1)[1])
            if every < 1:
                raise ValueError
            return lambda step: step % every == 0 or step == 1
        steps = {int(part) for part in text.split(",") if part.strip()}
        if not steps or min(steps) < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"--inspect {text!r}: give global step numbers like '1,50,200' or 'every:100'."
        ) from None
    return lambda step: step in steps


def first_nonfinite(outputs: Iterable[tuple[str, np.ndarray]]) -> str | None:
    """Name of the first layer (in forward order) whose output holds a NaN or Inf."""
    for name, out in outputs:
        if not np.all(np.isfinite(out)):
            return name
    return None


def inspect_record(
    outputs: Iterable[tuple[str, np.ndarray]], gradients: dict[str, np.ndarray]
) -> dict[str, Any]:
    """The ``inspect`` entry of a step record."""
    return {
        "outputs": {name: array_stats(out) for name, out in outputs},
        "gradients": {name: array_stats(g) for name, g in gradients.items()},
    }


class StepInspector:
    """``--inspect``: the per-layer statistics of the chosen global steps; and a batch's
    per-layer outputs, to name the first non-finite layer when a step fails."""

    def __init__(self, steps: str | None, backend: Backend, model: Model, device: Any) -> None:
        self.chosen = parse_steps(steps)
        self.backend, self.model, self.device = backend, model, device
        self.inspection = Inspection.of(backend)  # None: no layer outputs to name
        if self.chosen is not None:
            Inspection.required(backend, f"--inspect {steps}")

    def layer_outputs(self, x: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """Per-layer outputs of replica 0 (on ``device``) for this process's batch (eval
        mode, the weights before the step)."""
        inspection = self.inspection or Inspection.required(self.backend, "per-layer outputs")
        return inspection.layer_outputs(self.model, self.backend.to_tensor(x, self.device))

    def before_step(self, global_step: int, x: np.ndarray) -> list[tuple[str, np.ndarray]] | None:
        """The layer outputs of ``x`` when step ``global_step`` (1-based) is inspected."""
        if self.chosen is None or not self.chosen(global_step):
            return None
        return self.layer_outputs(x)

    def record(self, outputs: list[tuple[str, np.ndarray]]) -> dict[str, Any]:
        """The step record's ``inspect`` entry: ``outputs`` and the gradients of the step,
        still in place."""
        return inspect_record(outputs, self.backend.gradients(self.model))
