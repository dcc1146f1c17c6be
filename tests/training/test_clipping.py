"""Gradient clipping on every backend against numpy: the verbs (clip_gradients,
scale_gradients) and a clipped training step through the StepRunner."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.backend.base import Backend
from polytrain.cli.main import main
from polytrain.errors import ConfigError
from polytrain.neutral import reference
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig, numpy_step
from polytrain.testing.capabilities import FP64, require
from polytrain.testing.conformance import batch
from polytrain.training.recipe import Recipe
from polytrain.training.step import CLIP_EPS, StepRunner

DTYPES = ["float32", "float64"]


def two_replicas_with_gradients(backend: Backend, dtype: str) -> Any:
    """An mlp on two devices, each replica holding the gradient of its own batch."""
    if dtype == "float64":
        require(backend, FP64)
    spec = get_model_spec("mlp")
    model = backend.build_model(spec, backend.devices("cpu:2"), dtype=dtype)
    backend.set_params(model, spec.init_params(seed=3))
    for replica, device in enumerate(model.devices):
        x, y = batch(spec, 6, seed=replica)
        xt = backend.to_tensor(x.astype(dtype), device)
        with backend.record():
            logits = backend.forward(model, xt, replica=replica, train=True)
            loss = backend.cross_entropy(logits, backend.to_tensor(y, device), "mean")
        backend.backward(loss)
    return model


def replica_grads(backend: Backend, model: Any) -> list[dict[str, np.ndarray]]:
    return [backend.gradients(model, replica=r) for r in range(model.num_devices)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_gradients_clamps_every_replica(backend: Backend, dtype: str) -> None:
    """Each element to [-v, v], in the gradients' dtype (0.1 is no float32 number: a
    float32 bound would be off by ~1e-9 in float64)."""
    model = two_replicas_with_gradients(backend, dtype)
    before = replica_grads(backend, model)
    limit = 0.1 * max(float(np.abs(g).max()) for g in before[0].values())
    backend.clip_gradients(model, limit)
    for want, got in zip(before, replica_grads(backend, model), strict=True):
        for k, g in want.items():
            assert got[k].dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got[k], np.clip(g, -limit, limit), err_msg=k)
        assert any((np.abs(g) > limit).any() for g in want.values())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_gradients_multiplies_every_replica(backend: Backend, dtype: str) -> None:
    model = two_replicas_with_gradients(backend, dtype)
    before = replica_grads(backend, model)
    factor = 0.1234567891234
    backend.scale_gradients(model, factor)
    tol = 0 if dtype == "float64" else 1e-7
    for want, got in zip(before, replica_grads(backend, model), strict=True):
        for k, g in want.items():
            assert got[k].dtype == np.dtype(dtype)
            np.testing.assert_allclose(got[k], g * factor, rtol=tol, atol=0, err_msg=k)


def numpy_clip(grads: dict[str, np.ndarray], norm: float | None, value: float | None) -> None:
    """The reference: value clipping, then global-norm clipping (PyTorch's formula)."""
    if value is not None:
        for g in grads.values():
            np.clip(g, -value, value, out=g)
    if norm is not None:
        total = float(np.sqrt(sum(float(np.sum(g**2)) for g in grads.values())))
        coef = min(norm / (total + CLIP_EPS), 1.0)
        for g in grads.values():
            g *= coef


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "clip"),
    [("float64", "norm"), ("float64", "value"), ("float64", "both"), ("float32", "both")],
)
def test_clipped_steps_match_numpy(backend: Backend, dtype: str, clip: str) -> None:
    """Three momentum steps on two devices with clipping equal numpy's: clipping acts on
    the gradient summed over the devices (clipping each replica's part first differs)."""
    if dtype == "float64":
        require(backend, FP64)
    spec = get_model_spec("mlp")
    params = spec.init_params(seed=6)
    ref = {k: v.astype(np.float64) for k, v in params.items()}
    x0, y0 = batch(spec, 8, seed=0)
    first = reference.mlp_gradients(spec, ref, x0, y0)
    norm0 = float(np.sqrt(sum(float(np.sum(g**2)) for g in first.values())))
    norm = 0.3 * norm0 if clip in ("norm", "both") else None
    value = 0.2 * max(float(np.abs(g).max()) for g in first.values())
    value = value if clip in ("value", "both") else None  # type: ignore[assignment]
    config = OptimizerConfig(name="momentum", lr=0.1, momentum=0.9)
    precision = "fp64" if dtype == "float64" else "fp32"
    model = backend.build_model(spec, backend.devices("cpu:2"), dtype=dtype)
    backend.set_params(model, params)
    opt = backend.make_optimizer(model, config)
    runner = StepRunner(
        backend, model, opt, precision=precision, clip_grad_norm=norm, clip_grad_value=value
    )
    unclipped = {k: v.copy() for k, v in ref.items()}
    slots: dict[str, dict[str, np.ndarray]] = {}
    unclipped_slots: dict[str, dict[str, np.ndarray]] = {}
    for i in range(3):
        x, y = batch(spec, 8, seed=i)
        runner.train_step(x, y)
        cast = ref if dtype == "float64" else {k: v.astype(np.float32) for k, v in ref.items()}
        grads = reference.mlp_gradients(spec, cast, x, y)
        numpy_clip(grads, norm, value)
        numpy_step(config, ref, grads, slots, i)
        plain = reference.mlp_gradients(spec, unclipped, x, y)
        numpy_step(config, unclipped, plain, unclipped_slots, i)
    atol = 1e-12 if dtype == "float64" else 2e-5
    for replica in range(2):
        got = backend.get_params(model, replica)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=atol, err_msg=k)
    assert max(float(np.abs(ref[k] - unclipped[k]).max()) for k in ref) > 1e-3  # it clipped


def test_clip_flags_validated(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--clip-grad-value must be a finite number > 0"):
        Recipe(clip_grad_value=float("inf"))
    assert main(["train", "--backend", "numpy", "--clip-grad-norm", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--clip-grad-norm must be a finite number > 0, got -1.0.")
    assert len(err.splitlines()) == 1


def test_the_reference_is_pytorchs_clipping() -> None:
    """numpy_clip (the yardstick above) equals torch.nn.utils' clip_grad_value_ then
    clip_grad_norm_, including the 1e-6 in the norm's denominator."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    grads = {k: rng.standard_normal(shape) for k, shape in (("a", (3, 4)), ("b", (5,)))}
    params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in grads.values()]
    for p, g in zip(params, grads.values(), strict=True):
        p.grad = torch.tensor(g)
    torch.nn.utils.clip_grad_value_(params, 0.8)
    torch.nn.utils.clip_grad_norm_(params, 1.5)
    numpy_clip(grads, 1.5, 0.8)
    for p, g in zip(params, grads.values(), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-15, atol=0)


def test_fp16_clips_the_unscaled_gradients(backend: Backend) -> None:
    """Under fp16 the loss (so the gradient) is scaled by 2**16: clipping must come after
    unscaling, or the clamped gradient would be ~V / 2**16 and the update vanish."""
    support = backend.precision_support(backend.device("cpu")).get("fp16")
    if support is None or not support.supported:
        pytest.skip(f"backend {backend.name!r} has no fp16 on the CPU")
    spec = get_model_spec("mlp")
    params = spec.init_params(seed=6)
    x, y = batch(spec, 8)
    grads = reference.mlp_gradients(spec, params, x, y)
    value = 0.2 * max(float(np.abs(g).max()) for g in grads.values())
    model = backend.build_model(spec, dtype="float32")
    backend.set_params(model, params)
    opt = backend.make_optimizer(model, OptimizerConfig(name="sgd", lr=1.0))
    runner = StepRunner(backend, model, opt, precision="fp16", clip_grad_value=value)
    assert runner.mixed_precision.loss_scale > 1000
    assert not runner.train_step(x, y).skipped
    numpy_clip(grads, None, value)
    got = backend.get_params(model)
    for k, g in grads.items():
        step = params[k] - got[k]  # lr 1: the clipped gradient itself
        assert float(np.abs(step - g).max()) < 0.05 * value, k
