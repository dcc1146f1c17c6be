"""The accuracy count read every N steps (``metrics_every``) gives the numbers of reading it
every step: the same epoch records and step losses, the same totals after a mid-epoch
checkpoint and resume, with one host read per step instead of two."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.backend.base import Backend
from polytrain.plugins.registry import get_backend
from polytrain.testing.recorders import StepLosses
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

# 80 samples in batches of 8: 10 steps an epoch, so N=3 reads mid-epoch and at its end
RECIPE: dict[str, Any] = dict(
    model="mlp", batch_size=8, epochs=2, optimizer="momentum", lr=0.05, seed=3
)


@pytest.fixture(scope="module")
def data() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 100).astype(np.int64)
    x[np.arange(100), 0, 0, y] += 4.0  # learnable, so the counts change from step to step
    return {"train": (x[:80], y[:80]), "test": (x[80:], y[80:])}


def fit(
    backend: str | Backend, data: Any, metrics_every: int, **kwargs: Any
) -> tuple[list[dict[str, Any]], list[float]]:
    losses = StepLosses()
    trainer = Trainer(Recipe(**RECIPE), backend, datasets=data, plugins=[losses],
                      progress=False, metrics_every=metrics_every, **kwargs)  # fmt: skip
    summary = trainer.fit()
    epochs = [(e.train_loss, e.train_metric, e.test_metric) for e in summary.epochs]
    return [dict(zip(("loss", "accuracy", "test"), e, strict=True)) for e in epochs], losses.values


@pytest.mark.slow
@pytest.mark.parametrize("every", [3, 1000])
def test_reading_every_n_steps_gives_the_same_numbers(
    backend_name: str, data: Any, every: int
) -> None:
    ref_epochs, ref_losses = fit(backend_name, data, 1)
    epochs, losses = fit(backend_name, data, every)
    assert losses == ref_losses
    assert epochs == ref_epochs
    assert 0 < ref_epochs[-1]["accuracy"] < 1  # a count that the test can get wrong


@pytest.mark.slow
def test_mid_epoch_resume_gives_the_uninterrupted_totals(
    backend_name: str, data: Any, tmp_path: Path
) -> None:
    ref_epochs, ref_losses = fit(backend_name, data, 1)
    out = tmp_path / "run"
    fit(backend_name, data, 3, out_dir=out, checkpoint_every=5, keep_checkpoints=10)
    mid = out / "checkpoints" / "step-00000005"  # epoch 1, step 5: two counts still held
    epochs, losses = fit(backend_name, data, 3, out_dir=tmp_path / "resumed", resume=mid)
    assert losses == ref_losses[5:]
    assert epochs == ref_epochs


def counting(backend: Backend) -> Callable[[], int]:
    """Count the backend's host reads (``to_numpy``) from now on; returns the reader."""
    reads = [0]
    read = backend.to_numpy

    def to_numpy(tensor: Any) -> np.ndarray:
        reads[0] += 1
        return read(tensor)

    backend.to_numpy = to_numpy  # type: ignore[method-assign]
    return lambda: reads[0]


def test_one_host_read_per_step(backend_name: str, data: Any) -> None:
    def reads_per_epoch(every: int) -> list[int]:
        backend = get_backend(backend_name)
        trainer = Trainer(Recipe(**{**RECIPE, "epochs": 1}), backend, datasets=data,
                          progress=False, metrics_every=every)  # fmt: skip
        runner, (x, y) = trainer.runner, data["train"]
        reads = counting(backend)
        per_step = []
        for step in range(10):
            before = reads()
            runner.train_step(x[8 * step : 8 * step + 8], y[8 * step : 8 * step + 8])
            per_step.append(reads() - before)
        before = reads()
        runner.read_metrics()
        return [*per_step, reads() - before]

    assert reads_per_epoch(1) == [2] * 10 + [0]
    assert reads_per_epoch(4) == [1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1]
    assert reads_per_epoch(1000) == [1] * 10 + [1]
