"""Honest endings: a diverging run, a run of skipped steps, and the checkpoint kept as the
last good one (polytrain.training.health)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from polytrain.cli.main import main
from polytrain.errors import ConfigError
from polytrain.io.checkpoint import CheckpointManager
from polytrain.plugins.registry import get_backend
from polytrain.training.health import RunHealth, tensor_problem
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

SGD = ["--train-samples", "3200", "--test-samples", "32", "--batch-size", "32",
       "--epochs", "1", "--optimizer", "sgd", "--quiet"]  # fmt: skip


def step_losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["global_step"]: r["loss"] for r in records if r["event"] == "step"}


@pytest.mark.slow
def test_a_loss_that_explodes_but_stays_finite_stops_and_keeps_no_bad_checkpoint(
    backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["train", "--backend", backend_name, *SGD, "--lr", "1e6", "--checkpoint-every", "1"]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "global step 2" in err and "exceeds 10 times its start" in err, err
    assert "No checkpoint was taken before it went wrong" in err
    assert CheckpointManager(out).latest() is None
    assert (out / "checkpoints" / "diverged" / "step-00000001").is_dir()  # kept, out of the way


@pytest.mark.slow
def test_the_last_good_checkpoint_is_the_one_before_the_loss_went_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"  # the lr climbs by 0.5 a step until the loss blows up
    args = ["train", "--backend", "numpy", *SGD, "--lr", "20", "--warmup-steps", "40"]
    assert (
        main([*args, "--checkpoint-every", "1", "--keep-checkpoints", "1", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    losses = step_losses(out)  # the steps before the stop
    stop = int(re.search(r"global step (\d+)", err)[1])  # type: ignore[index]
    assert stop == max(losses) + 1 > 6, err
    latest = CheckpointManager(out).latest()
    assert latest is not None and str(latest) in err
    kept = int(latest.name.split("-")[1])
    assert kept == stop - 2  # checkpoint stop - 1 gave the bad loss, stop - 2 a healthy one
    assert losses[kept + 1] < 10 * losses[1]
    aside = [p.name for p in (out / "checkpoints" / "diverged").iterdir()]
    assert aside == [f"step-{stop - 1:08d}"]  # kept 1, and the good one was not pruned


@pytest.mark.slow
def test_a_run_of_skipped_steps_is_not_reported_as_completed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = get_backend("torch")
    if not backend.precision_support(backend.devices("cpu")[0])["fp16"].supported:
        pytest.skip("torch cannot train in fp16 on this CPU")
    out = tmp_path / "run"
    args = ["train", "--backend", "torch", *SGD, "--lr", "1e6", "--precision", "fp16"]
    assert main([*args, "--out", str(out), "--max-loss-growth", "inf"]) == 2
    err = capsys.readouterr().err
    assert "were skipped because their gradients overflowed" in err, err
    assert "--max-skipped" in err


def test_a_short_run_is_judged_at_its_end() -> None:
    health = RunHealth(max_skipped=0.5)
    for step in range(1, 5):  # fewer steps than the share needs: judged at the end
        assert health.observe(step, 2.3, skipped=step > 1, scaled=True) is None
    problem = health.skipped_problem()
    assert problem is not None and "3 of 4 steps (75 %)" in problem.reason


def test_the_start_loss_survives_a_resume() -> None:
    health = RunHealth()
    for step in range(1, 7):
        assert health.observe(step, 2.0, skipped=False, scaled=False) is None
    resumed = RunHealth()
    resumed.load_state_dict(json.loads(json.dumps(health.state_dict())))
    problem = resumed.observe(7, 25.0, skipped=False, scaled=False)
    assert problem is not None and "exceeds 10 times its start 2" in problem.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_skipped": 1.5}, "--max-skipped must be a share in [0, 1]"),
        ({"max_loss_growth": 1.0}, "--max-loss-growth must be > 1"),
        ({"max_loss_growth": float("nan")}, "--max-loss-growth must be > 1"),
    ],
)
def test_thresholds_out_of_range_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        Trainer(Recipe(train_samples=32, test_samples=32), "numpy", **kwargs)  # type: ignore[arg-type]


def test_the_tensors_of_a_state_are_judged_by_name() -> None:
    finite = {"fc.weight": np.ones((2, 2), np.float32), "count": np.arange(3)}
    assert tensor_problem(finite, {"fc.weight": {"exp_avg": np.zeros((2, 2))}}) is None
    params = {**finite, "fc.bias": np.array([1.0, np.inf], np.float32)}
    problem = tensor_problem(params, {"fc.weight": {"exp_avg": np.full((2, 2), np.nan)}})
    assert problem is not None and problem.non_finite
    assert "1 of 3 parameter tensors (first 'fc.bias')" in problem.reason
    assert "1 of 1 optimizer slot tensors (first 'fc.weight/exp_avg')" in problem.reason
