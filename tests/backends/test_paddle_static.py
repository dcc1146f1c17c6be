"""Paddle's static fast path (``--fast``, or the automatic mode's choice): the training step
as a static program with oneDNN convolutions, on the eager model's own tensors. It must
give the eager step's numbers from the same state (lockstep), hand its state to eager
runs and back (resume, checkpoints, convert), and be what the automatic mode picks when
it pays (docs/performance.md, "Paddle's static graph")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.neutral.models import (
    AvgPool2d,
    Conv2d,
    Dropout,
    Flatten,
    Linear,
    ModelSpec,
    ReLU,
    get_model_spec,
    seq,
)
from polytrain.neutral.optim import OptimizerConfig
from polytrain.parity.lockstep import grad_differences
from polytrain.testing import backends_under_test
from polytrain.testing.conformance import tiny_resnet
from polytrain.testing.recorders import StepLosses
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Datasets, Trainer, load_datasets

pytestmark = pytest.mark.skipif(
    "paddle" not in backends_under_test(), reason="needs the paddle backend"
)


def wide() -> ModelSpec:
    """A convolution over 16 channels (oneDNN's block: its bias is added, not folded)."""
    net = seq(("conv1", Conv2d(1, 16, 3)), ("relu1", ReLU()), ("conv2", Conv2d(16, 6, 3)),
              ("pool", AvgPool2d(2)), ("flatten", Flatten()),
              ("fc", Linear(6 * 5 * 5, 10)))  # fmt: skip
    return ModelSpec("wide", net, input_shape=(1, 14, 14), init="kaiming_normal")


def backend_pair(spec: ModelSpec, **step: Any) -> dict[bool, tuple[Any, Any, Any]]:
    """eager (False) and static (True): backend, model, step runner, same initial state."""
    from polytrain import get_backend

    out = {}
    for fast in (False, True):
        b = get_backend("paddle", fast=fast)
        model = b.build_model(spec)
        b.set_params(model, spec.init_params(0))
        opt = b.make_optimizer(model, OptimizerConfig(name="momentum", lr=0.05, momentum=0.9))
        out[fast] = (b, model, StepRunner(b, model, opt, **step))
    assert out[True][1].static is not None, "the --fast model has no static step"
    assert out[False][1].static is None
    return out


def batch(spec: ModelSpec, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *spec.input_shape)).astype(np.float32)
    return x, rng.integers(0, 10, n).astype(np.int64)


@pytest.mark.parametrize(
    ("spec", "step", "grad_tol"),
    [
        (get_model_spec("lenet"), {}, 1e-4),
        (tiny_resnet(), {}, 2e-2),  # BatchNorm's float32 cancellation (docs/semantics.md)
        (wide(), {"accumulate": 2, "clip_grad_norm": 0.5, "clip_grad_value": 0.05}, 1e-4),
    ],
    ids=["lenet", "tiny-resnet", "wide-accumulate-clip"],
)
def test_a_static_step_from_the_eager_state_gives_the_eager_numbers(
    spec: ModelSpec, step: dict[str, Any], grad_tol: float
) -> None:
    """Lockstep: before every step both load one state (parameters, BatchNorm statistics,
    momentum buffers); the loss, the gradients and the updated state agree."""
    runs = backend_pair(spec, **step)
    state = spec.init_params(0)
    slots: dict[str, Any] | None = None
    for i in range(3):
        x, y = batch(spec, 32, i)
        got = {}
        for fast, (b, model, runner) in runs.items():
            b.set_params(model, state)
            if slots is not None:
                runner.optimizer.load_state_dict(slots)
            result = runner.train_step(x, y)
            got[fast] = (result, b.gradients(model), b.get_params(model),
                         runner.optimizer.state_dict())  # fmt: skip
        eager, static = got[False], got[True]
        assert abs(static[0].loss_sum - eager[0].loss_sum) / len(x) <= 1e-6
        assert static[0].metric_sum == eager[0].metric_sum
        worst = grad_differences(static[1], eager[1])
        assert max(worst.values()) <= grad_tol, worst
        for name, value in eager[2].items():
            np.testing.assert_allclose(static[2][name], value, rtol=1e-4, atol=1e-6, err_msg=name)
        state, slots = eager[2], eager[3]


RECIPE = dict(train_samples=320, test_samples=64, batch_size=64, optimizer="momentum", lr=0.02)


@pytest.fixture(scope="module")
def data() -> Datasets:
    return load_datasets(Recipe(**RECIPE))


def train(data: Datasets, fast: bool, epochs: int, out: Path | None, resume: Path | None = None
          ) -> tuple[list[float], Trainer]:  # fmt: skip
    losses = StepLosses()
    trainer = Trainer(Recipe(**RECIPE, epochs=epochs), "paddle", fast=fast, out_dir=out,
                      resume=resume, plugins=[losses], progress=False, datasets=data)  # fmt: skip
    trainer.fit()
    assert (static_step_of(trainer) is not None) == fast
    return losses.values, trainer


def static_step_of(trainer: Trainer) -> Any:
    """The trainer's model's static step (None: it trains eagerly)."""
    from polytrain_paddle._model import PaddleModel

    return PaddleModel.of(trainer.model).static


@pytest.mark.slow
def test_resume_moves_between_static_and_eager(data: Datasets, tmp_path: Path) -> None:
    full, _ = train(data, True, 4, None)
    first, _ = train(data, True, 2, tmp_path / "s")
    again, _ = train(data, True, 4, tmp_path / "s", resume=tmp_path / "s")
    np.testing.assert_allclose(first + again, full, rtol=0, atol=1e-6)  # static is repeatable
    for a, b in ((True, False), (False, True)):
        out = tmp_path / f"{a}-{b}"
        head, _ = train(data, a, 2, out)
        tail, trainer = train(data, b, 4, out, resume=out)
        assert len(head) + len(tail) == len(full) == 20
        # the other path's kernels round differently: ~1e-6 after 20 steps
        np.testing.assert_allclose(head + tail, full, rtol=0, atol=2e-5)
        assert [e.epoch for e in trainer.history] == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_static_runs_checkpoint_converts_to_native_files(data: Datasets, tmp_path: Path) -> None:
    from polytrain import get_backend
    from polytrain.cli.main import main

    _, trainer = train(data, True, 1, tmp_path / "run")
    want = trainer.backend.get_params(trainer.model)
    native = tmp_path / "m.pdparams"
    assert main(["convert", str(tmp_path / "run"), str(native), "--to", "paddle"]) == 0
    b = get_backend("paddle")
    model = b.build_model(get_model_spec("lenet"))
    b.load_native(model, str(native))
    got = b.get_params(model)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_the_automatic_mode_picks_the_static_graph_when_it_pays(data: Datasets) -> None:
    long_run = Trainer(Recipe(**RECIPE, epochs=50), "paddle", progress=False, datasets=data)
    choice = long_run.compile_choice
    assert choice.fast, choice.reason
    assert choice.reason.endswith("to repay Paddle's static graph (~0.1 s)"), choice.reason
    assert static_step_of(long_run) is not None
    short = Trainer(Recipe(**RECIPE, epochs=1, max_steps=1), "paddle", progress=False,
                    datasets=data)  # fmt: skip
    assert not short.compile_choice.fast and "planned steps <" in short.compile_choice.reason
    assert static_step_of(short) is None
    fp64 = Trainer(Recipe(**RECIPE, epochs=50, precision="fp64"), "paddle", progress=False,
                   datasets=data)  # fmt: skip
    assert not fp64.compile_choice.fast and "fp64" in fp64.compile_choice.reason


@pytest.mark.parametrize("case", ["dropout", "two-devices", "float64"])
def test_what_the_static_graph_cannot_run_trains_eagerly_and_says_so(
    case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from polytrain import get_backend

    spec = get_model_spec("lenet")
    if case == "dropout":
        net = seq(("flatten", Flatten()), ("drop", Dropout(0.5)), ("fc", Linear(784, 10)))
        spec = ModelSpec("drop", net, input_shape=(1, 28, 28))
    b = get_backend("paddle", fast=True)
    devices = b.devices("cpu:2") if case == "two-devices" else None
    model = b.build_model(spec, devices, dtype="float64" if case == "float64" else "float32")
    assert model.static is None
    err = capsys.readouterr().err
    assert "paddle static graph not used:" in err and "training eagerly" in err
    why = {"dropout": "Dropout", "two-devices": "several devices", "float64": "float32"}[case]
    assert why in err
