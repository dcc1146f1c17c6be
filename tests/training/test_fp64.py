"""--precision fp64, the parity mode: whole runs agree across frameworks, device counts
and resumes to ~1e-12, where float32 runs part ways after a few dozen steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain import get_backend
from polytrain.errors import ConfigError
from polytrain.io.checkpoint import load_checkpoint
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.parity.compare import BackendRun, Tolerances, compare_runs
from polytrain.testing import backends_under_test, batch, tiny_resnet
from polytrain.testing.recorders import StepLosses
from polytrain.training.recipe import Recipe
from polytrain.training.step import StepRunner
from polytrain.training.trainer import Datasets, Trainer, load_datasets

BACKENDS = backends_under_test()
# lr 0.1 plain SGD on real images: the parity recipe of docs/semantics.md, whose float32
# runs of different frameworks part ways within ~20 steps; 40 steps of batch 64 keep the
# test short.
RECIPE = dict(
    train_samples=2560, test_samples=256, batch_size=64, optimizer="sgd", lr=0.1, epochs=1
)


@pytest.fixture(scope="module")
def data() -> Datasets:
    return load_datasets(Recipe(**RECIPE))  # type: ignore[arg-type]


def train(backend: str, data: Datasets, out: Path | None = None, **changes: object) -> StepLosses:
    losses = StepLosses()
    recipe = Recipe(**{**RECIPE, "precision": "fp64", **changes})  # type: ignore[arg-type]
    Trainer(recipe, backend, out_dir=out, plugins=[losses], progress=False, datasets=data).fit()
    return losses


@pytest.mark.slow
def test_free_runs_agree_across_frameworks_and_device_counts(data: Datasets) -> None:
    runs = {b: train(b, data).values for b in BACKENDS}
    runs[f"{BACKENDS[0]} cpu:3"] = train(BACKENDS[0], data, devices="cpu:3").values
    reference = runs[BACKENDS[0]]
    assert len(reference) == 40 and max(reference) > min(reference) + 0.1  # it trained
    for name, losses in runs.items():
        np.testing.assert_allclose(losses, reference, rtol=0, atol=1e-10, err_msg=name)


@pytest.mark.slow
def test_checkpoint_keeps_float64_and_resume_is_exact(
    backend_name: str, data: Datasets, tmp_path: Path
) -> None:
    full = train(backend_name, data, epochs=2).values
    first = train(backend_name, data, out=tmp_path, epochs=1).values
    ck = load_checkpoint(tmp_path)
    assert {str(a.dtype) for a in ck.params.values()} == {"float64"}
    assert ck.recipe is not None and ck.recipe["precision"] == "fp64"
    losses = StepLosses()
    recipe = Recipe(**{**RECIPE, "precision": "fp64", "epochs": 2})  # type: ignore[arg-type]
    Trainer(recipe, backend_name, out_dir=tmp_path, resume=tmp_path, plugins=[losses],
            progress=False, datasets=data).fit()  # fmt: skip
    np.testing.assert_array_equal(first + losses.values, full)


def test_model_and_precision_must_agree() -> None:
    b = get_backend(BACKENDS[0])
    spec = get_model_spec("mlp")
    model = b.build_model(spec)
    opt = b.make_optimizer(model, OptimizerConfig("sgd", lr=0.1))
    with pytest.raises(ConfigError, match="needs a model built with dtype='float64'"):
        StepRunner(b, model, opt, precision="fp64")


def _run(name: str, losses: list[float]) -> BackendRun:
    epoch = {"train_loss": losses[-1], "test_metric": 0.5, "samples_per_second": 1.0,
             "seconds": 1.0}  # fmt: skip
    return BackendRun(name, "0", ["cpu"], {}, losses, [None] * len(losses), [epoch], 1.0, None)


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_compare_holds_fp64_free_runs_to_the_step_tolerance(precision: str) -> None:
    """Free runs that part ways are reported in fp32 and a failure in fp64."""
    runs = [_run("a", [2.3, 2.2, 2.1]), _run("b", [2.3, 2.2, 2.0])]
    result = compare_runs(runs, Recipe(precision=precision), Tolerances(step_loss=1e-4))
    assert result.pairs[0].diverged_at_step == 3
    if precision == "fp32":
        assert result.ok
    else:
        assert result.failures == [
            "free runs a vs b (fp64): the loss differs by 1.00e-01 at step 3 (tolerance 1e-04 "
            "over the first 200 steps)"
        ]


def batchnorm_run(
    backend: str, steps: int = 10, batch_size: int = 16, **options: Any
) -> tuple[list[float], dict[str, np.ndarray], np.ndarray]:
    """``steps`` momentum steps of a residual net with BatchNorm in float64 (train mode:
    batch statistics forward, running mean and torch's unbiased running variance updated),
    then eval-mode logits from the running statistics."""
    b = get_backend(backend, **options)
    spec = tiny_resnet()
    model = b.build_model(spec, dtype="float64")
    b.set_params(model, spec.init_params(seed=4))
    opt = b.make_optimizer(model, OptimizerConfig("momentum", lr=0.1, momentum=0.9))
    runner = StepRunner(b, model, opt, precision="fp64")
    losses = []
    for i in range(steps):
        x, y = batch(spec, batch_size, seed=i)
        result = runner.train_step(x, y)
        losses.append(result.loss_sum / result.samples)
    x, _ = batch(spec, batch_size, seed=99)
    return losses, b.get_params(model), runner.predict(x)


@pytest.mark.slow
def test_batchnorm_training_agrees_across_frameworks() -> None:
    runs = {name: batchnorm_run(name) for name in BACKENDS}
    ref_losses, ref_params, ref_logits = runs[BACKENDS[0]]
    assert ref_losses[-1] < ref_losses[0] - 0.1  # it trained
    assert any("running_var" in k for k in ref_params)
    for name, (losses, params, logits) in runs.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-12, err_msg=name)
        for k, v in ref_params.items():
            np.testing.assert_allclose(params[k], v, rtol=0, atol=1e-11, err_msg=f"{name} {k}")
        np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-11, err_msg=name)
