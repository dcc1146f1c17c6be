"""Gradient accumulation (the global-batch gradient contract in docs/architecture.md): K
micro-batches of b make the same update as one batch of K*b, alone and combined with several
devices, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from polytrain.backend.base import Backend
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.training.step import StepResult, StepRunner

TOL = 1e-6


Batches = list[tuple[np.ndarray, np.ndarray]]
Params = dict[str, np.ndarray]


def train(
    b: Backend, devices: str, accumulate: int, batches: Batches, optimizer: str = "momentum"
) -> tuple[Params, list[StepResult]]:
    """Params after one step per batch, and the step results."""
    spec = get_model_spec("lenet")
    model = b.build_model(spec, b.devices(devices))
    b.set_params(model, spec.init_params(0))
    opt = b.make_optimizer(model, OptimizerConfig(optimizer, lr=0.05))
    runner = StepRunner(b, model, opt, accumulate=accumulate)
    results = [runner.train_step(x, y) for x, y in batches]
    return b.get_params(model), results


def make_batches(steps: int, size: int, seed: int = 0) -> Batches:
    rng = np.random.default_rng(seed)
    return [
        (rng.random((size, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, size))
        for _ in range(steps)
    ]


def assert_same(params: Params, reference: Params, what: str) -> None:
    worst = max(float(np.abs(params[k] - reference[k]).max()) for k in reference)
    assert worst <= TOL, f"{what}: max |difference| of updated weights {worst:.2e} > {TOL}"


def assert_same_results(got: list[StepResult], ref: list[StepResult]) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.samples == r.samples and g.metric_sum == r.metric_sum
        assert g.loss_sum == pytest.approx(r.loss_sum, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 5])
def test_k_micro_batches_equal_one_batch(backend: Backend, steps: int) -> None:
    batches = make_batches(steps, 64)
    ref, ref_results = train(backend, "cpu", 1, batches)
    got, results = train(backend, "cpu", 4, batches)  # 4 micro-batches of 16
    assert_same(got, ref, f"{backend.name}: accumulate 4 x 16 vs 64, {steps} step(s)")
    assert_same_results(results, ref_results)


@pytest.mark.slow
def test_uneven_micro_batches_still_average_the_global_batch(backend: Backend) -> None:
    batches = make_batches(2, 10)  # 3 micro-batches of 4, 3, 3
    ref, _ = train(backend, "cpu", 1, batches, optimizer="sgd")
    got, _ = train(backend, "cpu", 3, batches, optimizer="sgd")
    assert_same(got, ref, f"{backend.name}: accumulate 3 over 10 samples")


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 5])
def test_accumulation_composes_with_devices(backend: Backend, steps: int) -> None:
    batches = make_batches(steps, 64)
    ref, ref_results = train(backend, "cpu", 1, batches)
    got, results = train(backend, "cpu:2", 2, batches)  # 2 devices x 2 micro-batches of 16
    assert_same(got, ref, f"{backend.name}: cpu:2 x accumulate 2 vs one batch, {steps} step(s)")
    assert_same_results(results, ref_results)
