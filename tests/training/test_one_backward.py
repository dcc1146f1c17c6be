"""A step with one backward per replica (``accumulate == 1``): the optimizer may let that
backward overwrite the gradients (MXNet: grad_req 'write') instead of zeroing them and
adding. The gradients must equal what zeroing and adding give, on every backend, and a
parameter the backward does not reach must get a zero gradient, not the last step's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.backend.base import Backend
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.testing import backends_under_test
from polytrain.training.step import StepRunner


def _batch(seed: int, n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n)


def _gradients(b: Backend, model: object, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    with b.record():
        loss = b.cross_entropy(b.forward(model, b.to_tensor(x), train=True), b.to_tensor(y))
    b.backward(loss)
    return b.gradients(model)


@pytest.mark.slow
def test_one_backward_gives_the_gradients_of_zero_and_add(backend: Backend) -> None:
    b, spec = backend, get_model_spec("lenet")
    model = b.build_model(spec)
    b.set_params(model, spec.init_params(0))
    opt = b.make_optimizer(model, OptimizerConfig("sgd", lr=0.1))  # no step is taken
    (x1, y1), (x2, y2) = _batch(1), _batch(2)
    opt.zero_grad()
    reference = _gradients(b, model, x2, y2)
    for x, y in [(x1, y1), (x2, y2)]:  # the second step's backward must not add the first's
        opt.zero_grad_for_one_backward()
        got = _gradients(b, model, x, y)
        opt.gradients_done()
    for name, g in reference.items():
        np.testing.assert_allclose(b.gradients(model)[name], g, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got[name], g, rtol=1e-6, atol=1e-7)
    opt.zero_grad()  # and a plain zero_grad makes backward calls add again
    _gradients(b, model, x2, y2)
    twice = _gradients(b, model, x2, y2)
    for name, g in reference.items():
        np.testing.assert_allclose(twice[name], 2 * g, rtol=1e-5, atol=1e-6)


def test_a_parameter_the_backward_misses_gets_no_stale_gradient_on_mxnet(
    branchy: Callable[[str], Any],
) -> None:
    """Under 'write' a gradient the backward did not reach keeps the last step's values
    unless the step zeroes it (``gradients_done``): read it after the step (the optimizer
    itself skips the parameter, tests/training/test_unreached_parameters.py)."""
    if "mxnet" not in backends_under_test():
        pytest.skip("mxnet is not under test")
    b = get_backend("mxnet")
    net = branchy("mxnet")
    model = b.build_model(net)
    opt = b.make_optimizer(model, OptimizerConfig("sgd", lr=0.1))
    runner = StepRunner(b, model, opt)
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 4), dtype=np.float32), rng.integers(0, 3, 8)
    runner.train_step(x, y)  # both layers get gradients
    assert all(np.any(g != 0) for k, g in b.gradients(model).items() if k.startswith("extra"))
    net.use_extra = False
    runner.train_step(x, y)  # `extra` is not reached: its gradient is zero, not the last one
    grads = b.gradients(model)
    extra = [k for k in grads if k.startswith("extra")]
    assert extra and all(not np.any(grads[k]) for k in extra)
    assert all(np.any(grads[k]) for k in grads if k.startswith("first"))
