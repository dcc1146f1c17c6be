"""The shipped conformance suite, run against every installed (or required) backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from marks import slow
from toy_backends import core_verbs, toy_backend

from polytrain import get_backend
from polytrain.backend.base import Backend
from polytrain.backend.precision import PrecisionSupport
from polytrain.neutral import reference, reference_grad
from polytrain.testing import BackendConformance
from polytrain.testing.layer_cases import (
    BATCH,
    LAYER_CASES,
    LayerCase,
    case_input,
    case_params,
    case_spec,
)
from polytrain.testing.placement import on_test_device


class TestConformance(BackendConformance):
    @pytest.fixture
    def backend(self, backend_name: str) -> Backend:
        return on_test_device(get_backend(backend_name))  # $POLYTRAIN_TEST_DEVICE

    # every layer case on every backend: most of the suite's time (CI runs them, --quick not)
    test_layer_forward_and_backward = slow(BackendConformance.test_layer_forward_and_backward)
    test_float64_layer_forward_and_backward = slow(
        BackendConformance.test_float64_layer_forward_and_backward
    )


# -- the suite itself: its yardstick, and that it catches what it claims to ------------------


@pytest.mark.parametrize("case", [c for c in LAYER_CASES if c.train], ids=lambda c: c.id)
def test_reference_gradients_match_finite_differences(case: LayerCase) -> None:
    """The numpy backward equals central differences of the numpy forward (float64),
    on a few coordinates of the input and of every parameter."""
    spec = case_spec(case)
    rng = np.random.default_rng(1)
    x = case_input(case, rng, "float64")
    y = rng.integers(0, 10, BATCH)
    params = case_params(spec, x if case.vocab else x.astype(np.float32))
    p = {k: v.astype(np.float64) for k, v in params.items() if k != "inject.weight"}
    _, gx, grads = reference_grad.loss_gradients(spec, p, x, y)

    def loss(pp: dict[str, np.ndarray]) -> float:
        logits = reference_grad.forward(spec, pp, pp["x"])
        return float(reference.cross_entropy(logits, y))

    eps = 1e-6
    for name, grad in (({} if case.vocab else {"x": gx}) | grads).items():
        values = {**p, "x": x}
        for flat in rng.choice(grad.size, min(grad.size, 6), replace=False):
            i = np.unravel_index(flat, grad.shape)
            up, down = values[name].copy(), values[name].copy()
            up[i] += eps
            down[i] -= eps
            numeric = (loss({**values, name: up}) - loss({**values, name: down})) / (2 * eps)
            assert abs(numeric - grad[i]) < 1e-7, (case.id, name, i)


def test_a_backend_whose_conv_weights_get_no_gradient_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The numpy backend's convolution backward patched to give the weight no gradient:
    every forward check still passes, the layer check of the convolution fails."""
    from polytrain_numpy import _kernels

    real = _kernels.conv2d_backward

    def no_weight_gradient(*args: Any, **kwargs: Any) -> Any:
        gx, gw, gb = real(*args, **kwargs)
        return gx, np.zeros_like(gw), gb

    suite, backend = BackendConformance(), get_backend("numpy")
    conv = next(c for c in LAYER_CASES if c.id == "conv")
    suite.test_layer_forward_and_backward(backend, conv)  # passes unpatched
    monkeypatch.setattr(_kernels, "conv2d_backward", no_weight_gradient)
    suite.test_forward_matches_numpy(backend, "lenet")
    with pytest.raises(AssertionError, match=r"conv: gradient of layer\.weight"):
        suite.test_layer_forward_and_backward(backend, conv)


def test_undeclared_capabilities_skip_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend that declares no float64 (precision_support), and one without the
    Inspection, Collectives and NativeIO capabilities, get those tests skipped, each
    naming why, instead of failed."""
    backend = get_backend("numpy")
    declared = type(backend).precision_support

    def without_fp64(self: Backend, device: Any = None) -> dict[str, PrecisionSupport]:
        support = declared(self, device)
        support["fp64"] = PrecisionSupport("fp64", False, "not built with float64 kernels")
        return support

    monkeypatch.setattr(type(backend), "precision_support", without_fp64)
    suite = BackendConformance()
    fp64 = "does not declare fp64: no float64 on the CPU \\(not built with float64 kernels\\)"
    with pytest.raises(pytest.skip.Exception, match=fp64):
        suite.test_float64_forward_matches_numpy(backend, "lenet")
    with pytest.raises(pytest.skip.Exception, match=fp64):
        suite.test_float64_layer_forward_and_backward(backend, LAYER_CASES[0])
    core_only = toy_backend(core_verbs())
    with pytest.raises(pytest.skip.Exception, match="does not declare layer_outputs"):
        suite.test_layer_outputs_follow_the_forward(core_only)
    with pytest.raises(pytest.skip.Exception, match="does not declare collectives"):
        suite.test_broadcast(core_only)
    with pytest.raises(pytest.skip.Exception, match="does not declare native files"):
        suite.test_native_save_load(core_only, None)
