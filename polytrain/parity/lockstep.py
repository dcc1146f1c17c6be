"""Lockstep parity: the same step, from the same state, on every backend.

Free-running trajectories of different frameworks decorrelate after a few dozen steps:
float32 rounding differs by ~1e-7 between their kernels, and SGD amplifies any such
difference (torch against itself with weights perturbed by 1e-7 reaches 0.4 loss
difference within 60 steps at lr 0.1). So "the same math" is checked here one step at a
time: before every step each backend loads the reference backend's exact state
(canonical parameters and optimizer slots), takes the step on the same batch, and its
loss, every parameter's gradient, the gradient norm and the updated parameters are
compared with the reference's.

A parameter's gradient difference is relative (:func:`grad_differences`): the L2 norm of
the difference over the norm of the reference's gradient, or over 1 % of the whole
model's gradient norm where that is larger (a bias just before a BatchNorm has a gradient
of ~0 that is all rounding). Norms, not the largest entry: in float32 single entries of
the layers before a BatchNorm differ by several percent (docs/semantics.md).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytrain.backend.base import Backend
from polytrain.backend.precision import param_dtype
from polytrain.data import ArrayDataset, BatchLoader
from polytrain.neutral.spec_file import resolve_model_spec as get_model_spec
from polytrain.plugins.registry import get_backend, registered_backends
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
    grad_diff: dict[str, list[float]] = field(default_factory=dict)  # per step: the worst
    grad_diff_param: dict[str, list[str]] = field(default_factory=dict)  # ... and its parameter
    # per backend (the reference too), per step: seconds of its step from the given state,
    # the state's loads and reads included (docs/performance.md, "The lockstep's cost")
    step_seconds: dict[str, list[float]] = field(default_factory=dict)
    step_cpu_seconds: dict[str, list[float]] = field(default_factory=dict)  # the same, CPU
    compare_seconds: float = 0.0  # the differences' computation, all steps and backends
    omp_wait_policy: str = ""  # how the frameworks' OpenMP pools wait (quiet_openmp_pools)
    fast: dict[str, bool] = field(default_factory=dict)  # per backend: its compiled mode

    @classmethod
    def empty(cls, backends: list[str], omp_wait_policy: str = "") -> LockstepResult:
        """No step yet; ``backends[0]`` is the reference."""
        result = cls(backends[0], 0, omp_wait_policy=omp_wait_policy)
        for name in backends:
            result.step_seconds[name], result.step_cpu_seconds[name] = [], []
        for name in backends[1:]:
            for per_step in (result.loss_diff, result.grad_norm_rel_diff, result.param_diff,
                             result.grad_diff, result.grad_diff_param):  # fmt: skip
                per_step[name] = []
        return result

    def worst(self, backend: str) -> dict[str, float]:
        return {
            "loss": max(self.loss_diff[backend], default=0.0),
            "grad_norm_rel": max(self.grad_norm_rel_diff[backend], default=0.0),
            "grad": max(self.grad_diff.get(backend, []), default=0.0),
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
            "grad_diff": self.grad_diff,
            "grad_diff_param": self.grad_diff_param,
            "seconds": {b: sum(v) for b, v in self.step_seconds.items()},
            "cpu_seconds": {b: sum(v) for b, v in self.step_cpu_seconds.items()},
            "compare_seconds": self.compare_seconds,
            "omp_wait_policy": self.omp_wait_policy,
            "fast": self.fast,
        }

    def worst_grad_step(self, backend: str) -> tuple[int, str, float]:
        """(1-based step, parameter, relative difference) of the largest gradient difference."""
        diffs = self.grad_diff[backend]
        i = int(np.argmax(diffs))
        return i + 1, self.grad_diff_param[backend][i], diffs[i]


#: A parameter whose gradient norm is below this share of the model's counts as ~0.
GRAD_FLOOR = 1e-2


def grad_differences(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> dict[str, float]:
    """Per parameter of ``ref``: ||got - ref|| / max(||ref||, GRAD_FLOOR * the norm of the
    whole model's ``ref`` gradient) (L2 norms); ``inf`` without a gradient or for NaN."""
    norms = {k: float(np.linalg.norm(v.astype(np.float64))) for k, v in ref.items()}
    total = float(np.sqrt(sum(n * n for n in norms.values())))
    floor = max(GRAD_FLOOR * total, float(np.finfo(np.float64).tiny))
    out = {}
    for k, v in ref.items():
        g = got.get(k)
        if g is None or g.shape != v.shape:
            out[k] = float("inf")
            continue
        diff = float(np.linalg.norm(g.astype(np.float64) - v.astype(np.float64)))
        rel = diff / max(norms[k], floor)
        out[k] = rel if np.isfinite(rel) else float("inf")  # NaN would compare as in range
    return out


@dataclass
class StepOutcome:
    """What one backend's step from a given state produced (numpy, canonical names)."""

    loss: float
    grad_norm: float
    params: dict[str, np.ndarray]
    optimizer_state: dict[str, Any]
    grads: dict[str, np.ndarray]


def quiet_openmp_pools(frameworks: Sequence[str]) -> str:
    """Let the OpenMP pools (torch's, Paddle's, MXNet's) of the ``frameworks`` (module
    names) this process imports from now on sleep between parallel regions
    (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a policy. The lockstep runs every
    framework in one process, one after the other: by default a pool spins after its work
    (Intel's for 200 ms), taking the cores from the next framework's step (torch 2.0x,
    Paddle 1.6x slower measured: docs/performance.md, "The lockstep's cost"). Returns the
    policy in effect, naming any of ``frameworks`` imported before, which keeps its own."""
    if "OMP_WAIT_POLICY" in os.environ:
        return f"{os.environ['OMP_WAIT_POLICY']} (the user's OMP_WAIT_POLICY)"
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    early = [name for name in frameworks if name in sys.modules]
    return f"PASSIVE, except {', '.join(early)} (imported before)" if early else "PASSIVE"


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
            clip_grad_norm=recipe.clip_grad_norm,
            clip_grad_value=recipe.clip_grad_value,
            loss=recipe.loss_spec(),
            metric=recipe.metric_spec(),
            dropout_masks=recipe.parity_masks(),
        )

    def eval_logits(self, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        self.backend.set_params(self.model, params)
        return self.runner.predict(x)

    def step_from(
        self, params: dict[str, np.ndarray], opt_state: dict[str, Any] | None, x: np.ndarray,
        y: np.ndarray, lr: float,
    ) -> StepOutcome:  # fmt: skip
        b = self.backend
        b.set_params(self.model, params)
        if opt_state is not None:
            self.optimizer.load_state_dict(opt_state)
        self.optimizer.set_lr(lr)
        result = self.runner.train_step(x, y)
        grads = b.gradients(self.model)
        squares = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())
        return StepOutcome(
            result.loss_sum / result.samples,
            float(np.sqrt(squares)),
            b.get_params(self.model),
            self.optimizer.state_dict(),
            grads,
        )


def lockstep(
    backends: list[str],
    recipe: Recipe,
    steps: int,
    *,
    train: ArrayDataset,
    threads: int | None = None,
    progress: Callable[[int], None] | None = None,
    modes: dict[str, bool | None] | None = None,
) -> LockstepResult:
    """Run ``steps`` lockstep steps of ``recipe``; the first backend is the reference.
    ``progress`` is called with the number of steps done after each one. ``modes``: per
    backend, its compiled mode (``fast``: the one its free run trained in, so the lockstep
    checks that path: Paddle's static graph, jax's jit); absent or None: the backend's
    default."""
    infos = registered_backends()  # numpy: polytrain's own dependency, loaded long before
    frameworks = [infos[b].framework for b in backends if b in infos]
    policy = quiet_openmp_pools([name for name in frameworks if name != "numpy"])
    fast = {name: (modes or {}).get(name) for name in backends}
    runners = {
        name: _Runner(get_backend(name, threads=threads, fast=fast[name]), recipe)
        for name in backends
    }
    reference = backends[0]
    result = LockstepResult.empty(backends, omp_wait_policy=policy)
    result.fast = {name: runners[name].backend.fast for name in backends}
    loader = BatchLoader(train, recipe.batch_size, seed=recipe.seed, drop_last=recipe.drop_last)
    params = get_model_spec(recipe.model).init_params(recipe.seed)
    opt_state: dict[str, Any] | None = None
    done = 0
    epoch = 0
    while done < steps:
        for x, y in loader.epoch(epoch):
            lr = recipe.lr_at(done, recipe.total_steps(len(loader)))
            ref = _timed_step(result, runners, reference, (params, opt_state, x, y, lr))
            for name in backends[1:]:
                got = _timed_step(result, runners, name, (params, opt_state, x, y, lr))
                started = time.perf_counter()
                _record(result, name, got, ref)
                result.compare_seconds += time.perf_counter() - started
            params, opt_state = ref.params, ref.optimizer_state
            done += 1
            if progress is not None:
                progress(done)
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


def _timed_step(
    result: LockstepResult, runners: dict[str, _Runner], name: str, args: tuple[Any, ...]
) -> StepOutcome:
    """``runners[name].step_from(*args)``, its wall and CPU seconds added to ``result``."""
    started, cpu = time.perf_counter(), time.process_time()
    outcome = runners[name].step_from(*args)
    result.step_seconds[name].append(time.perf_counter() - started)
    result.step_cpu_seconds[name].append(time.process_time() - cpu)
    return outcome


def _record(result: LockstepResult, name: str, got: StepOutcome, ref: StepOutcome) -> None:
    """Append backend ``name``'s differences from the reference at this step."""
    per_param = grad_differences(got.grads, ref.grads)
    worst = max(per_param, key=per_param.__getitem__)
    result.grad_diff[name].append(per_param[worst])
    result.grad_diff_param[name].append(worst)
    result.loss_diff[name].append(abs(got.loss - ref.loss))
    norm_diff = abs(got.grad_norm - ref.grad_norm) / max(ref.grad_norm, 1e-12)
    result.grad_norm_rel_diff[name].append(norm_diff)
    result.param_diff[name].append(
        max(float(np.max(np.abs(got.params[k] - ref.params[k]))) for k in ref.params)
    )
