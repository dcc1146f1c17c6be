"""Callbacks that act: a plugin stops a run cleanly, sets the learning rate (the same
numbers on every backend, kept across a resume), and keeps the best epoch's checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain import ConfigError, hookimpl
from polytrain.cli.main import main
from polytrain.io.checkpoint import load_checkpoint, read_manifest
from polytrain.plugins.control import TrainControl
from polytrain.plugins.records import EpochRecord, RunInfo, StepRecord
from polytrain.plugins.user_plugin import load_plugin
from polytrain.testing import backends_under_test
from polytrain.training.keep_best import KeepBest
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Datasets, Trainer, load_datasets

BACKENDS = backends_under_test()
# 96 samples, batch 16: 6 steps an epoch (CI is near its limit: keep it small)
TINY: dict[str, Any] = dict(model="mlp", train_samples=96, test_samples=32, batch_size=16,
                            optimizer="sgd", lr=0.1, epochs=1)  # fmt: skip


class StopAtStep3:
    """Named by ``--plugin test_callbacks:StopAtStep3`` in the CLI test."""

    @hookimpl
    def polytrain_step_end(self, step: StepRecord, control: TrainControl) -> None:
        if step.global_step == 3:
            control.request_stop("enough at step 3")


class SetLr:
    """lr 0.05 from step 3 on (set at the end of step 2), 0.01 from step 5 on."""

    def __init__(self, changes: dict[int, float] | None = None) -> None:
        self.changes = {2: 0.05, 4: 0.01} if changes is None else changes

    @hookimpl
    def polytrain_step_end(self, step: StepRecord, control: TrainControl) -> None:
        if step.global_step in self.changes:
            control.set_lr(self.changes[step.global_step])


class Steps:
    """Records every step's loss and lr (an observer: no control argument)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.lrs: list[float] = []

    @hookimpl
    def polytrain_step_end(self, step: StepRecord) -> None:
        self.losses.append(step.loss)
        self.lrs.append(step.lr)


@pytest.fixture(scope="module")
def data() -> Datasets:
    return load_datasets(Recipe(**TINY))


def fit(backend: str, data: Datasets, *plugins: object, **kwargs: Any) -> tuple[Steps, Any]:
    steps = Steps()
    recipe = Recipe(**{**TINY, "precision": "fp64", **kwargs.pop("recipe", {})})
    summary = Trainer(recipe, backend, plugins=[*plugins, steps], progress=False,
                      datasets=data, **kwargs).fit()  # fmt: skip
    return steps, summary


@pytest.mark.slow
def test_a_plugin_stops_the_run_cleanly_from_the_cli(
    backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["train", "--backend", backend_name, "--model", "mlp", "--train-samples", "96",
            "--test-samples", "32", "--batch-size", "16", "--epochs", "2", "--quiet",
            "--json", "--out", str(out), "--plugin", "test_callbacks:StopAtStep3"]  # fmt: skip
    code = main(argv)
    assert code == 0
    assert "polytrain train: stopped: enough at step 3" in capsys.readouterr().err
    ck = load_checkpoint(out)
    assert ck.position["global_step"] == 3 and ck.position["epoch"] == 1
    assert [h["steps"] for h in ck.history] == [3]  # the stopped epoch's record, kept
    assert ck.history[0]["test_metric"] is not None  # and evaluated


@pytest.mark.slow
def test_a_recipe_file_names_the_plugins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plugin = [...]`` in a recipe file registers them as ``--plugin`` does."""
    config = tmp_path / "recipe.toml"
    config.write_text('plugin = ["test_callbacks:StopAtStep3"]\nepochs = 2\n')
    out = tmp_path / "run"
    argv = ["train", "--config", str(config), "--backend", "numpy", "--model", "mlp",
            "--train-samples", "96", "--test-samples", "32", "--batch-size", "16", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "stopped: enough at step 3" in capsys.readouterr().err
    assert load_checkpoint(out).position["global_step"] == 3
    config.write_text("plugin = [3]\n")
    assert main(argv) == 2
    assert "line 1: plugin: expected a string, got 3" in capsys.readouterr().err


@pytest.mark.slow
def test_the_same_lr_changes_give_the_same_losses_on_every_backend(data: Datasets) -> None:
    runs = {b: fit(b, data, SetLr())[0] for b in BACKENDS}
    reference = runs[BACKENDS[0]]
    assert reference.lrs == [0.1, 0.1, 0.05, 0.05, 0.01, 0.01]
    for name, run in runs.items():
        assert run.lrs == reference.lrs, name
        np.testing.assert_allclose(run.losses, reference.losses, rtol=0, atol=1e-10, err_msg=name)
    plain = fit(BACKENDS[0], data)[0]
    assert plain.lrs == [0.1] * 6
    assert plain.losses[:3] == reference.losses[:3]  # the first change acts from step 3 on
    assert abs(plain.losses[5] - reference.losses[5]) > 1e-6


def test_resume_goes_on_with_the_lr_a_plugin_set(data: Datasets, tmp_path: Path) -> None:
    backend = BACKENDS[0]
    full, _ = fit(backend, data, SetLr({2: 0.05}), out_dir=tmp_path / "a", checkpoint_every=3,
                  keep_checkpoints=5)  # fmt: skip
    assert full.lrs == [0.1, 0.1] + [0.05] * 4
    at3 = tmp_path / "a" / "checkpoints" / "step-00000003"
    assert read_manifest(at3)["extra"]["control"] == {"lr": 0.05}
    rest, _ = fit(backend, data, out_dir=tmp_path / "b", resume=at3)  # no plugin now
    assert rest.lrs == [0.05] * 3
    np.testing.assert_array_equal(rest.losses, full.losses[3:])


class PlayedAccuracies:
    """Plays a given test_metric per epoch (a controlled metric for KeepBest)."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    @hookimpl(tryfirst=True)
    def polytrain_epoch_end(self, epoch: EpochRecord) -> None:
        epoch.test_metric = self.values[epoch.epoch]


@pytest.mark.slow
def test_keep_best_keeps_the_best_epochs_checkpoint(data: Datasets, tmp_path: Path) -> None:
    out = tmp_path / "run"
    _, summary = fit(BACKENDS[0], data, KeepBest("test_metric"), PlayedAccuracies(0.5, 0.7, 0.6),
                     out_dir=out, keep_checkpoints=1, recipe={"epochs": 3})  # fmt: skip
    assert summary.stop_reason == "completed"
    best = out / "checkpoints" / "best"
    assert read_manifest(best)["position"]["global_step"] == 2 * summary.final_step // 3
    kept = {p.name for p in (out / "checkpoints").iterdir()}
    assert "step-00000006" not in kept and "best" in kept  # pruning skips best
    assert load_checkpoint(best).history[-1]["epoch"] == 1


def test_keep_best_and_plugin_paths_say_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="choose one of"):
        KeepBest("val_acc")
    with pytest.raises(ConfigError, match=r"give pkg\.module:Class"):
        load_plugin("test_callbacks")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'"):
        load_plugin("no_such_module_xyz:Thing")
    with pytest.raises(ConfigError, match="has no 'Missing'"):
        load_plugin("test_callbacks:Missing")
    with pytest.raises(ConfigError, match="none of the hooks"):
        load_plugin("test_callbacks:TINY")
    assert isinstance(load_plugin("test_callbacks:StopAtStep3"), StopAtStep3)
    assert main(["train", "--backend", "numpy", "--plugin", "nope:X"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["train", "--backend", "numpy", "--keep-best", "val_accuracy"]) == 2
    assert "add --out" in capsys.readouterr().err


class OnCheckpoint:
    @hookimpl
    def polytrain_checkpoint_saved(self, path: str) -> None:
        pass


def test_a_plugin_of_any_training_hook_loads() -> None:
    """--plugin refused a plugin whose only hook was polytrain_checkpoint_saved."""
    assert isinstance(load_plugin("test_callbacks:OnCheckpoint"), OnCheckpoint)


def test_control_reads_parameters_and_history(data: Datasets) -> None:
    seen: dict[str, Any] = {}

    class Reader:
        @hookimpl
        def polytrain_epoch_end(self, run: RunInfo, control: TrainControl) -> None:
            params = control.parameters()
            seen["writeable"] = any(a.flags.writeable for a in params.values())
            seen["names"] = sorted(params)
            seen["history"] = [e.epoch for e in control.history]

    fit("numpy", data, Reader(), recipe={"epochs": 2})
    assert seen["writeable"] is False and "fc1.weight" in " ".join(seen["names"])
    assert seen["history"] == [0, 1]
    control = TrainControl(dict, list)
    with pytest.raises(ConfigError, match="finite number"):
        control.set_lr(float("nan"))
    with pytest.raises(ConfigError, match="not latest"):
        control.keep_checkpoint_as("latest")
