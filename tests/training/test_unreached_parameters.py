"""A parameter that no backward of a step reached keeps its weights and optimizer state on
every backend and device count of one process, as torch steps no parameter whose gradient
is None and Gluon's Trainer (``ignore_stale_grad``) skips a stale one: a user's model with a
branch that does not run every step trains to the same numbers on each framework.

The model is each framework's own (the ``branchy`` fixture): ``first`` (Linear 4 -> 3)
always runs, ``extra`` (Linear 3 -> 3) only while ``use_extra`` is set. Three steps
(``extra`` reached, not reached, reached) against a float64 numpy reference in which
``extra`` skips the middle step (its momentum buffer, Adam moments and Adam step count
included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.neutral.optim import OptimizerConfig, numpy_step
from polytrain.testing import backends_under_test
from polytrain.training.step import StepRunner

FRAMEWORKS = [b for b in ("torch", "paddle", "mxnet") if b in backends_under_test()]
CONFIGS = {
    "momentum": OptimizerConfig("momentum", lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": OptimizerConfig("adam", lr=0.1),
}
USE_EXTRA = (True, False, True)  # the second step does not reach `extra`


def _gradients(
    p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, use_extra: bool
) -> dict[str, np.ndarray]:
    """Gradients of the mean cross-entropy of the branchy model, float64."""
    h = x @ p["first.weight"].T + p["first.bias"]
    logits = h @ p["extra.weight"].T + p["extra.bias"] if use_extra else h
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    d = e / e.sum(axis=1, keepdims=True)
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    grads = {}
    if use_extra:
        grads["extra.weight"], grads["extra.bias"] = d.T @ h, d.sum(axis=0)
        d = d @ p["extra.weight"]
    grads["first.weight"], grads["first.bias"] = d.T @ x, d.sum(axis=0)
    return grads


def _reference(
    config: OptimizerConfig, init: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
) -> dict[str, np.ndarray]:
    params = {k: v.astype(np.float64) for k, v in init.items()}
    slots: dict[str, dict[str, np.ndarray]] = {}
    steps = {"first": 0, "extra": 0}  # each layer's own update count (Adam's t)
    for use_extra in USE_EXTRA:
        grads = _gradients(params, x.astype(np.float64), y, use_extra)
        for layer in steps:
            mine = {k: v for k, v in params.items() if k.startswith(layer) and k in grads}
            if mine:
                steps[layer] = numpy_step(config, mine, grads, slots, steps[layer])
    return params


def _assert_trains_as_the_reference(
    net: Any, b: Any, devices: str, config: OptimizerConfig, accumulate: int = 1
) -> None:
    model = b.build_model(net, b.devices(devices))
    rng = np.random.default_rng(0)
    shapes = {k: v.shape for k, v in b.get_params(model).items()}
    init = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in shapes.items()}
    b.set_params(model, init)
    runner = StepRunner(b, model, b.make_optimizer(model, config), accumulate=accumulate)
    x, y = rng.random((8, 4), dtype=np.float32), rng.integers(0, 3, 8)
    for use_extra in USE_EXTRA:
        for replica in {id(r): r for r in [net, *model.replicas]}.values():
            replica.use_extra = use_extra  # each device's copy of the model
        runner.train_step(x, y)
    got, want = b.get_params(model), _reference(config, init, x, y)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-5, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("devices", ["cpu", "cpu:2"])
@pytest.mark.parametrize("optimizer", sorted(CONFIGS))
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_parameter_no_backward_reached_is_not_stepped(
    branchy: Callable[[str], Any], framework: str, optimizer: str, devices: str, accumulate: int
) -> None:
    b = get_backend(framework)
    _assert_trains_as_the_reference(branchy(framework), b, devices, CONFIGS[optimizer], accumulate)


@pytest.mark.parametrize("framework", [f for f in FRAMEWORKS if f != "mxnet"])
def test_one_collective_per_parameter_leaves_out_what_no_replica_reached(
    branchy: Callable[[str], Any], framework: str
) -> None:
    """``bucket_mb=0``: the per-parameter reduction (not the flat buckets) on 2 devices."""
    b = get_backend(framework, bucket_mb=0)
    _assert_trains_as_the_reference(branchy(framework), b, "cpu:2", CONFIGS["adam"])
