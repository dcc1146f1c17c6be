"""Lockstep parity: the same step, from the same state, on every backend.

Free-running trajectories of different frameworks decorrelate after a few dozen steps:
float32 rounding differs by ~1e-7 between their kernels, and SGD amplifies any such
difference (torch against itself with weights perturbed by 1e-7 reaches 0.4 loss
difference within 60 steps at lr 0.1). So "the same math" is checked here one step at a
time: before every step each backend loads the reference backend's exact state
(canonical parameters and optimizer slots), takes the step on the same batch, and its
loss, gradient norm and updated parameters are compared with the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytrain.backend.base import Backend
from polytrain.backend.precision import param_dtype
from polytrain.data import ArrayDataset, BatchLoader
from polytrain.neutral.models import get_model_spec
from polytrain.plugins.registry import get_backend
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner


@dataclass
class LockstepResult:
    """Per-step differences of each backend against the reference."""

    reference: str
    steps: int
    loss_diff: dict[str, list[float]] = field(default_factory=dict)
    grad_norm_rel_diff: dict[str, list[float]] = field(default_factory=dict)
    param_diff: dict[str, list[float]] = field(default_factory=dict)
    eval_logit_diff: dict[str, float] = field(default_factory=dict)

    def worst(self, backend: str) -> dict[str, float]:
        return {
            "loss": max(self.loss_diff[backend], default=0.0),
            "grad_norm_rel": max(self.grad_norm_rel_diff[backend], default=0.0),
            "params": max(self.param_diff[backend], default=0.0),
            "eval_logits": self.eval_logit_diff.get(backend, 0.0),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "steps": self.steps,
            "worst": {b: self.worst(b) for b in self.loss_diff},
            "loss_diff": self.loss_diff,
            "grad_norm_rel_diff": self.grad_norm_rel_diff,
            "param_diff": self.param_diff,
        }


class _Runner:
    def __init__(self, backend: Backend, recipe: Recipe) -> None:
        spec = get_model_spec(recipe.model)
        self.backend = backend
        devices = backend.devices(recipe.devices)
        dtype = param_dtype(recipe.precision)
        self.model = backend.build_model(spec, devices, dtype=dtype)
        self.optimizer = backend.make_optimizer(self.model, recipe.optimizer_config())
        self.runner = StepRunner(
            backend,
            self.model,
            self.optimizer,
            accumulate=recipe.accumulate,
            precision=recipe.precision,
        )

    def eval_logits(self, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        self.backend.set_params(self.model, params)
        return self.runner.predict(x)

    def step_from(
        self, params: dict[str, np.ndarray], opt_state: dict[str, Any] | None, x: np.ndarray,
        y: np.ndarray, lr: float,
    ) -> tuple[float, float, dict[str, np.ndarray], dict[str, Any]]:  # fmt: skip
        b = self.backend
        b.set_params(self.model, params)
        if opt_state is not None:
            self.optimizer.load_state_dict(opt_state)
        self.optimizer.set_lr(lr)
        result = self.runner.train_step(x, y)
        grad_norm = b.grad_norm(self.model)
        return (
            result.loss_sum / result.samples,
            grad_norm,
            b.get_params(self.model),
            self.optimizer.state_dict(),
        )


def lockstep(
    backends: list[str],
    recipe: Recipe,
    steps: int,
    *,
    train: ArrayDataset,
    threads: int | None = None,
) -> LockstepResult:
    """Run ``steps`` lockstep steps of ``recipe``; the first backend is the reference."""
    runners = {name: _Runner(get_backend(name, threads=threads), recipe) for name in backends}
    reference = backends[0]
    result = LockstepResult(reference, 0)
    for name in backends[1:]:
        result.loss_diff[name], result.grad_norm_rel_diff[name], result.param_diff[name] = (
            [],
            [],
            [],
        )
    loader = BatchLoader(train, recipe.batch_size, seed=recipe.seed, drop_last=recipe.drop_last)
    params = get_model_spec(recipe.model).init_params(recipe.seed)
    opt_state: dict[str, Any] | None = None
    done = 0
    epoch = 0
    while done < steps:
        for x, y in loader.epoch(epoch):
            lr = recipe.lr_at(done)
            ref = runners[reference].step_from(params, opt_state, x, y, lr)
            for name in backends[1:]:
                loss, norm, new_params, _ = runners[name].step_from(params, opt_state, x, y, lr)
                result.loss_diff[name].append(abs(loss - ref[0]))
                result.grad_norm_rel_diff[name].append(abs(norm - ref[1]) / max(ref[1], 1e-12))
                result.param_diff[name].append(
                    max(float(np.max(np.abs(new_params[k] - ref[2][k]))) for k in ref[2])
                )
            params, opt_state = ref[2], ref[3]
            done += 1
            if done >= steps:
                break
        epoch += 1
    result.steps = done
    # eval mode (BatchNorm from running statistics) from the reference's final state
    x_eval = train.x[: min(len(train), recipe.batch_size)]
    ref_logits = runners[reference].eval_logits(params, x_eval)
    for name in backends[1:]:
        logits = runners[name].eval_logits(params, x_eval)
        result.eval_logit_diff[name] = float(np.max(np.abs(logits - ref_logits)))
    return result
