"""Model parallel (``--pipeline-split``): a model cut into two stages on two devices
computes what the unsplit model does, trains the same, saves the same names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.backend.base import Backend
from polytrain.data import ArrayDataset
from polytrain.errors import BackendError, ConfigError
from polytrain.neutral.models import ModelSpec, get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.testing import tiny_resnet
from polytrain.testing.recorders import StepLosses
from polytrain.training.pipeline import PipelineModel, pipeline_backend, split_spec
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Datasets, Trainer

TOL = 1e-6


def run(
    b: Backend,
    spec: ModelSpec,
    devices: str,
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    accumulate: int = 1,
) -> tuple[np.ndarray, list[float], dict[str, np.ndarray], dict[str, Any], Any]:
    model = b.build_model(spec, b.devices(devices))
    b.set_params(model, spec.init_params(0))
    opt = b.make_optimizer(model, OptimizerConfig("momentum", lr=0.05))
    runner = StepRunner(b, model, opt, accumulate=accumulate)
    logits = runner.predict(x)
    losses = [runner.train_step(x, y).loss_sum for _ in range(steps)]
    return logits, losses, b.get_params(model), opt.state_dict(), model


def data(spec: ModelSpec, n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, *spec.input_shape), dtype=np.float32), rng.integers(0, 10, n)


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert list(a) == list(b), "the split model must keep the canonical names, in order"
    return max(float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max()) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,split", [("lenet", 1), ("lenet", 4), ("lenet", 7), ("lenet", 9), ("tiny-resnet", 3)]
)
def test_split_model_equals_unsplit(backend: Backend, model: str, split: int) -> None:
    spec = tiny_resnet() if model == "tiny-resnet" else get_model_spec(model)
    x, y = data(spec)
    ref = run(backend, spec, "cpu", x, y, steps=5)
    got = run(pipeline_backend(backend, split), spec, "cpu:2", x, y, steps=5)
    assert isinstance(got[4], PipelineModel)
    assert float(np.abs(got[0] - ref[0]).max()) <= TOL, "forward logits"
    np.testing.assert_allclose(got[1], ref[1], rtol=TOL, err_msg="losses")
    assert max_diff(got[2], ref[2]) <= TOL, "parameters (and BatchNorm buffers) after 5 steps"
    for name, slots in ref[3]["slots"].items():
        for slot, value in slots.items():
            assert float(np.abs(got[3]["slots"][name][slot] - value).max()) <= TOL, name
    assert got[3]["step"] == ref[3]["step"] == 5


def test_stages_live_on_their_devices(backend: Backend) -> None:
    b = pipeline_backend(backend, 4)
    devices = b.devices("cpu:2")
    model = b.build_model(get_model_spec("lenet"), devices)
    assert isinstance(model, PipelineModel)
    assert [s.devices for s in model.stages] == [[devices[0]], [devices[1]]]
    assert model.devices == devices[:1] and model.num_devices == 1
    assert model.stage_names[0] == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"]
    assert b.parameter_names(model) == backend.parameter_names(
        backend.build_model(get_model_spec("lenet"))
    )


@pytest.mark.slow
def test_split_composes_with_accumulation(backend: Backend) -> None:
    spec = get_model_spec("lenet")
    x, y = data(spec)
    ref = run(backend, spec, "cpu", x, y, steps=2)
    got = run(pipeline_backend(backend, 7), spec, "cpu:2", x, y, steps=2, accumulate=2)
    assert max_diff(got[2], ref[2]) <= TOL


def test_copy_to_is_differentiable(backend: Backend) -> None:
    dev0, dev1 = backend.devices("cpu:2")
    spec = get_model_spec("mlp")
    model = backend.build_model(spec, [dev0])
    backend.set_params(model, spec.init_params(0))
    x, y = data(spec, 4)
    with backend.record():
        logits = backend.copy_to(
            backend.forward(model, backend.to_tensor(x, dev0), train=True), dev1
        )
        loss = backend.cross_entropy(logits, backend.to_tensor(y, dev1), "sum")
    backend.backward(backend.scale_loss(loss, 4))
    grads = backend.gradients(model)
    assert all(np.abs(g).max() > 0 for g in grads.values()), "the copy cut the gradient"


def small_data() -> Datasets:
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (96, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 96)
    return Datasets(
        ArrayDataset(images, labels, num_classes=10),
        ArrayDataset(images[:40], labels[:40], num_classes=10),
    )


@pytest.mark.slow
def test_trainer_runs_split_and_resumes_unsplit(backend: Backend, tmp_path: Path) -> None:
    base: dict[str, Any] = dict(batch_size=32, optimizer="momentum", lr=0.02)
    full = StepLosses()
    ref = Trainer(
        Recipe(**base, epochs=2), backend, plugins=[full], progress=False, datasets=small_data()
    ).fit()
    first = StepLosses()
    Trainer(
        Recipe(**base, epochs=1, devices="cpu:2", pipeline_split=4),
        backend.name,
        out_dir=tmp_path,
        plugins=[first],
        progress=False,
        datasets=small_data(),
    ).fit()
    second = StepLosses()
    summary = Trainer(
        Recipe(**base, epochs=2),
        backend.name,
        resume=tmp_path,
        plugins=[second],
        progress=False,
        datasets=small_data(),
    ).fit()
    np.testing.assert_allclose(first.values + second.values, full.values, rtol=0, atol=TOL)
    assert summary.epochs[-1].test_metric == ref.epochs[-1].test_metric


def test_bad_splits_are_clear_errors(backend: Backend) -> None:
    spec = get_model_spec("lenet")
    with pytest.raises(ConfigError, match=r"give 1\.\.9.*0:conv1"):
        split_spec(spec, 10)
    with pytest.raises(ConfigError, match="exactly two devices"):
        pipeline_backend(backend, 4).build_model(spec, backend.devices("cpu:3"))
    with pytest.raises(ConfigError, match="--pipeline-split must be >= 1"):
        Recipe(pipeline_split=0)
    b = pipeline_backend(backend, 4)
    model = b.build_model(spec, b.devices("cpu:2"))
    with pytest.raises(BackendError, match=r"save_native.*--pipeline-split"):
        b.save_native(model, "/nonexistent/x")
    assert b.name == backend.name and isinstance(b, Backend)
