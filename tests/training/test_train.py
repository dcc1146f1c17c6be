"""The recipe loop on every backend: a small slice of Fashion-MNIST, hooks, metrics, CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from polytrain import NonFiniteLossError, hookimpl
from polytrain.cli.main import main
from polytrain.io.checkpoint import CheckpointManager, load_checkpoint
from polytrain.testing import backends_under_test
from polytrain.training.builtin_plugins import read_metrics
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

SMALL = dict(train_samples=512, test_samples=300, batch_size=64, epochs=2)


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.losses: list[float] = []
        self.lrs: list[float] = []

    @hookimpl
    def polytrain_train_start(self, run):  # type: ignore[no-untyped-def]
        self.events.append("start")

    @hookimpl
    def polytrain_step_end(self, run, step):  # type: ignore[no-untyped-def]
        self.losses.append(step.loss)
        self.lrs.append(step.lr)

    @hookimpl
    def polytrain_epoch_end(self, run, epoch):  # type: ignore[no-untyped-def]
        self.events.append(f"epoch{epoch.epoch}")

    @hookimpl
    def polytrain_train_end(self, run, summary):  # type: ignore[no-untyped-def]
        self.events.append("end")


@pytest.mark.slow
def test_small_run_learns_and_reports(backend_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    recorder = Recorder()
    trainer = Trainer(
        Recipe(**SMALL), backend_name, out_dir=tmp_path, plugins=[recorder], progress=False
    )
    summary = trainer.fit()
    assert recorder.events == ["start", "epoch0", "epoch1", "end"]
    assert len(recorder.losses) == 2 * 8
    assert summary.epochs[-1].train_loss < summary.epochs[0].train_loss
    assert summary.epochs[-1].test_metric is not None
    assert summary.epochs[-1].test_metric > 0.3  # chance is 0.1
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["event"] for r in records].count("step") == 16
    assert records[0]["event"] == "start" and records[0]["backend"] == backend_name
    assert records[0]["threads"], "the run header reports the thread settings"
    assert records[-1]["event"] == "end"


@pytest.mark.slow
def test_first_steps_agree_across_backends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Same seed, same data order: every backend's first losses agree closely."""
    names = backends_under_test()
    losses = {}
    for name in names:
        rec = Recorder()
        Trainer(Recipe(**{**SMALL, "epochs": 1}), name, plugins=[rec], progress=False).fit()
        losses[name] = np.array(rec.losses)
    ref = losses[names[0]]
    for name in names[1:]:
        np.testing.assert_allclose(losses[name], ref, rtol=0, atol=1e-4, err_msg=name)


@pytest.mark.slow
def test_non_finite_loss_stops_with_clear_message(backend_name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    recipe = Recipe(**{**SMALL, "epochs": 1, "lr": 1e6, "optimizer": "sgd"})
    # no loss-growth limit: the NaN itself is tested here
    trainer = Trainer(recipe, backend_name, progress=False, out_dir=tmp_path,
                      checkpoint_every=1, max_loss_growth=float("inf"))  # fmt: skip
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit()
    message = str(err.value)
    assert re.search(
        r"at epoch 1, step \d+ \(global step \d+\); the update was not applied", message
    )
    assert re.search(r"first layer whose output is NaN/Inf on this batch is '\w+'", message), (
        message
    )
    latest = CheckpointManager(tmp_path).latest()
    assert latest is not None and str(latest) in message
    good = load_checkpoint(latest).params
    assert all(np.all(np.isfinite(v)) for v in good.values())


@pytest.mark.slow
def test_cli_train_json(backend_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--backend", backend_name, "--train-samples", "256", "--test-samples", "100",
            "--batch-size", "64", "--epochs", "1", "--quiet", "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["final"]["steps"] == 4


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--backend", "torch", "--epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("polytrain train: error: --epochs must be an integer >= 1")
    assert main(["train", "--backend", "torch", "--model", "vgg"]) == 2
    assert "Unknown model 'vgg'" in capsys.readouterr().err


@pytest.mark.slow
def test_warmup_sets_each_steps_lr(backend_name: str) -> None:
    """Linear warm-up: step k of N uses lr*(k+1)/N; the backend applies the lr it is given."""
    rec = Recorder()
    base = {**SMALL, "epochs": 1, "optimizer": "sgd", "lr": 0.4}
    warm = Trainer(Recipe(**base, warmup_steps=4), backend_name, plugins=[rec], progress=False)
    warm.fit()
    assert rec.lrs == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4, 0.4, 0.4])
    first = {**base, "max_steps": 1}
    one_warm = Trainer(Recipe(**first, warmup_steps=4), backend_name, progress=False)
    one_plain = Trainer(Recipe(**{**first, "lr": 0.1}), backend_name, progress=False)
    one_warm.fit()
    one_plain.fit()
    a = one_warm.backend.get_params(one_warm.model)
    b = one_plain.backend.get_params(one_plain.model)
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) < 1e-6


def test_warmup_steps_validated() -> None:
    with pytest.raises(ValueError, match="--warmup-steps must be an integer >= 0"):
        Recipe(warmup_steps=-1)
    assert [Recipe(lr=1.0, warmup_steps=2).lr_at(s) for s in range(3)] == [0.5, 1.0, 1.0]
    assert Recipe(lr=1.0).lr_at(0) == 1.0
