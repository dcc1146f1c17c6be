"""Mixed precision (the loss-scaling contract in docs/architecture.md): the loss scaler's
rules, what each backend supports here and the errors where it cannot, bf16/fp16 steps
against fp32, unscaling, skipped steps, and the scaler's state through a checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from polytrain import get_backend
from polytrain.backend.base import Backend
from polytrain.backend.precision import PRECISIONS, LossScaler
from polytrain.data import ArrayDataset
from polytrain.errors import BackendError, ConfigError
from polytrain.io.checkpoint import load_checkpoint, save_checkpoint
from polytrain.neutral.models import get_model_spec, mlp
from polytrain.neutral.optim import OptimizerConfig
from polytrain.testing import backends_under_test
from polytrain.training.mixed_precision import MixedPrecision
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Datasets, Trainer

# What each framework can do on a CPU, measured on this project's machine
# (docs/architecture.md, traps: "Mixed precision on CPU"): torch autocasts both; Paddle's
# auto_cast does nothing on a CPU; MXNet's amp does bf16 but has no CPU float16 gemm.
CPU_SUPPORT = {
    "torch": {"bf16": True, "fp16": True},
    "paddle": {"bf16": False, "fp16": False},
    "mxnet": {"bf16": True, "fp16": False},
    "numpy": {"bf16": False, "fp16": False},  # float32/float64 only, anywhere
}
CPU_REASON = {
    ("paddle", "bf16"): "auto_cast does nothing",
    ("paddle", "fp16"): "auto_cast",
    ("mxnet", "fp16"): "FP16 gemm",
    ("numpy", "bf16"): "no bfloat16",
    ("numpy", "fp16"): "float32 or float64 only",
}


def batch(n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n)


def one_step(b: Backend, precision: str, scale: float | None = None, steps: int = 1) -> Any:
    """(step results, updated params, runner) of LeNet after ``steps`` SGD steps."""
    spec = get_model_spec("lenet")
    model = b.build_model(spec, b.devices("cpu"))
    b.set_params(model, spec.init_params(0))
    runner = StepRunner(
        b, model, b.make_optimizer(model, OptimizerConfig("sgd", lr=0.05)), precision=precision
    )
    if scale is not None:
        assert runner.mixed_precision.scaler is not None
        runner.mixed_precision.scaler.scale = scale
    x, y = batch()
    results = [runner.train_step(x, y) for _ in range(steps)]
    return results, b.get_params(model), runner


def tiny_data(n: int = 128) -> Datasets:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    return Datasets(
        ArrayDataset(images, labels, num_classes=10),
        ArrayDataset(images[:32], labels[:32], num_classes=10),
    )


# -- the loss scaler, no framework -----------------------------------------------------------


def test_scaler_defaults_are_contract_5() -> None:
    s = LossScaler()
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval) == (
        2.0**16,
        2,
        0.5,
        2000,
    )


def test_scaler_grows_after_2000_good_steps_and_backs_off_on_overflow() -> None:
    s = LossScaler()
    for _ in range(1999):
        s.update(True)
    assert s.scale == 2.0**16
    s.update(True)
    assert s.scale == 2.0**17 and s.good_steps == 0
    for _ in range(1500):
        s.update(True)
    s.update(False)  # an overflow halves the scale and restarts the count
    assert s.scale == 2.0**16 and s.good_steps == 0 and s.skipped == 1
    for _ in range(1999):
        s.update(True)
    assert s.scale == 2.0**16


def reference_scale(flags: list[bool], scale: float, interval: int) -> tuple[float, int]:
    good = 0
    for finite in flags:
        if not finite:
            scale, good = scale / 2, 0
        else:
            good += 1
            if good == interval:
                scale, good = scale * 2, 0
    return scale, good


@given(st.lists(st.booleans(), max_size=60), st.integers(1, 5))
def test_scaler_follows_the_rule(flags: list[bool], interval: int) -> None:
    s = LossScaler(growth_interval=interval)
    for finite in flags:
        s.update(finite)
    assert (s.scale, s.good_steps) == reference_scale(flags, 2.0**16, interval)
    assert s.skipped == flags.count(False)


def test_scaler_never_grows_into_inf() -> None:
    s = LossScaler(init_scale=2.0**127, growth_interval=1)
    s.update(True)
    s.update(True)
    assert s.scale == 2.0**127


def test_scaler_state_round_trip_and_bad_input() -> None:
    s = LossScaler(growth_interval=7)
    for finite in (True, True, False, True):
        s.update(finite)
    t = LossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    with pytest.raises(ConfigError, match="scaler state"):
        t.load_state_dict({"good_steps": 3})
    with pytest.raises(ConfigError, match="init_scale"):
        LossScaler(init_scale=0.0)
    with pytest.raises(ConfigError, match="growth_factor"):
        LossScaler(backoff_factor=1.5)


def test_scaler_state_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    s = LossScaler()
    s.update(False)
    s.update(True)
    spec = mlp(hidden=8)
    path = save_checkpoint(
        tmp_path / "ck", params=spec.init_params(0), spec=spec, scaler=s.state_dict()
    )
    restored = LossScaler()
    restored.load_state_dict(load_checkpoint(path).scaler or {})
    assert restored.state_dict() == s.state_dict()


def test_fp32_is_the_identity() -> None:
    class Untouchable:  # fp32 must not call the backend at all
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"fp32 called backend.{name}")

    mp = MixedPrecision(Untouchable(), "fp32", [])  # type: ignore[arg-type]
    with mp.autocast():
        pass
    assert mp.loss_scale == 1.0 and mp.unscale(None) is True  # type: ignore[arg-type]
    assert mp.state_dict() is None and mp.step_extra(False) == {}
    with pytest.raises(ConfigError, match="Unknown precision"):
        MixedPrecision(Untouchable(), "fp8", [])  # type: ignore[arg-type]


# -- what each backend supports here ----------------------------------------------------------


def test_precision_support_answers_every_precision(backend: Backend) -> None:
    support = backend.precision_support(backend.device("cpu"))
    assert list(support) == list(PRECISIONS)
    assert support["fp32"].supported
    for name, s in support.items():
        assert s.precision == name
        assert s.supported or s.detail, f"{name}: unsupported needs a reason"
    assert backend.supported_precisions(backend.device("cpu")) == [
        p for p in PRECISIONS if support[p].supported
    ]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cpu_support_matches_what_was_measured(backend: Backend, precision: str) -> None:
    if backend.name not in CPU_SUPPORT:
        pytest.skip("no expectation recorded for a third-party backend")
    support = backend.precision_support(backend.device("cpu"))[precision]
    assert support.supported is CPU_SUPPORT[backend.name][precision], str(support)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_unsupported_precision_is_a_clear_error_before_training(
    backend: Backend, precision: str
) -> None:
    if backend.precision_support(backend.device("cpu"))[precision].supported:
        pytest.skip(f"{backend.name} trains in {precision} here")
    recipe = Recipe(precision=precision, batch_size=64, epochs=1)
    with pytest.raises(BackendError) as err:
        Trainer(recipe, backend, datasets=tiny_data(), progress=False)
    message = str(err.value)
    assert f"'{backend.name}' cannot train in {precision} on cpu" in message
    assert "--precision fp32" in message
    reason = CPU_REASON.get((backend.name, precision))
    if reason:
        assert reason in message


def test_bf16_step_is_close_to_fp32(backend: Backend) -> None:
    if "bf16" not in backend.supported_precisions(backend.device("cpu")):
        pytest.skip(f"{backend.name} has no bf16 here")
    (r32,), p32, _ = one_step(backend, "fp32")
    (r16,), p16, _ = one_step(backend, "bf16")
    assert r16.loss_sum == pytest.approx(r32.loss_sum, rel=1e-2)
    diffs = {k: float(np.abs(p16[k] - p32[k]).max()) for k in p32}
    init = get_model_spec("lenet").init_params(0)
    moved = {k: float(np.abs(p32[k] - v).max()) for k, v in init.items()}
    assert max(diffs.values()) < 2e-4, diffs  # bf16 keeps ~3 digits of a 5e-2 * grad update
    assert max(diffs.values()) > 0, "bf16 computed exactly fp32: autocast did nothing"
    assert all(moved[k] > 10 * diffs[k] for k in moved), (moved, diffs)  # gradients not lost


def test_fp16_step_with_loss_scale_is_close_to_fp32(backend: Backend) -> None:
    if "fp16" not in backend.supported_precisions(backend.device("cpu")):
        pytest.skip(f"{backend.name} has no fp16 here")
    (r32,), p32, _ = one_step(backend, "fp32")
    (r16,), p16, runner = one_step(backend, "fp16")
    assert not r16.skipped and runner.mixed_precision.loss_scale == 2.0**16
    assert r16.loss_sum == pytest.approx(r32.loss_sum, rel=1e-2)
    assert 0 < max(float(np.abs(p16[k] - p32[k]).max()) for k in p32) < 2e-4


def test_fp16_overflow_skips_the_step_and_backs_off(backend: Backend) -> None:
    if "fp16" not in backend.supported_precisions(backend.device("cpu")):
        pytest.skip(f"{backend.name} has no fp16 here")
    (result,), params, runner = one_step(backend, "fp16", scale=2.0**40)  # fp16 max is 65504
    assert result.skipped and math.isfinite(result.loss_sum)
    init = get_model_spec("lenet").init_params(0)
    assert all(np.array_equal(params[k], init[k]) for k in init), "a skipped step moved weights"
    assert runner.mixed_precision.loss_scale == 2.0**39
    assert runner.mixed_precision.step_extra(True) == {"loss_scale": 2.0**39, "skipped": True}


@pytest.mark.slow
def test_unscale_gradients_divides_and_detects_inf(backend: Backend) -> None:
    spec = mlp(hidden=8)
    model = backend.build_model(spec, backend.devices("cpu:2"))
    backend.set_params(model, spec.init_params(0))
    x, y = batch(8)

    def gradients(scale: float) -> dict[str, np.ndarray]:
        opt = backend.make_optimizer(model, OptimizerConfig("sgd"))
        opt.zero_grad()
        xs, ys = backend.split_and_load(x, model.devices), backend.split_and_load(y, model.devices)
        for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
            with backend.record():
                loss = backend.cross_entropy(
                    backend.forward(model, xi, replica=i, train=True), yi, "sum"
                )
            backend.backward(backend.scale_loss(loss, len(x), scale))
        backend.sync_gradients(model)
        return backend.gradients(model, 1)

    plain = gradients(1.0)
    gradients(1024.0)
    assert backend.unscale_gradients(model, 1 / 1024) is True
    for name, g in backend.gradients(model, 1).items():
        np.testing.assert_allclose(g, plain[name], rtol=1e-6, atol=1e-9, err_msg=name)
    gradients(math.inf)
    assert backend.unscale_gradients(model, 1.0) is False


def test_fp16_scaler_state_is_checkpointed_and_restored(tmp_path: Path) -> None:
    b = get_backend("torch")
    if "fp16" not in b.supported_precisions(b.device("cpu")):
        pytest.skip("torch has no fp16 here")
    recipe = Recipe(precision="fp16", batch_size=64, epochs=1, lr=0.01)
    first = Trainer(recipe, b, out_dir=tmp_path, datasets=tiny_data(), progress=False)
    scaler = first.runner.mixed_precision.scaler
    assert scaler is not None
    scaler.scale, scaler.good_steps = 2.0**10, 1234  # as after a long run
    first.fit()
    saved = load_checkpoint(tmp_path).scaler
    assert saved == {"precision": "fp16", **scaler.state_dict()}
    assert saved["good_steps"] == 1236 and saved["scale"] == 2.0**10
    resumed = Trainer(
        Recipe(**{**recipe.to_dict(), "epochs": 2}),
        b,
        resume=tmp_path,
        datasets=tiny_data(),
        progress=False,
    )
    assert resumed.runner.mixed_precision.state_dict() == saved


def test_mxnet_autocast_is_scoped() -> None:
    if "mxnet" not in backends_under_test():
        pytest.skip("mxnet is not installed")
    import mxnet as mx

    b = get_backend("mxnet")
    original = mx.nd.Convolution
    x = mx.nd.ones((2, 1, 8, 8))
    w = mx.nd.ones((4, 1, 3, 3))
    with b.autocast("bf16"):
        inside = mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True)
        with b.autocast("bf16"):  # re-entrant
            pass
        assert mx.nd.Convolution is not original
    outside = mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True)
    assert mx.nd.Convolution is original
    assert inside.dtype != np.float32 and outside.dtype == np.float32
    assert b.to_numpy(inside).dtype == np.float32  # bf16 comes back as float32 numpy
