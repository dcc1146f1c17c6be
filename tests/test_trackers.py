"""Experiment trackers (``--log csv,mlflow,tensorboard``): real short runs, read back through
MLflow's own client and the csv module, and compared with the run's metrics.jsonl."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from polytrain.cli.main import main
from polytrain.training.trackers import param_text

mlflow_tracking = pytest.importorskip("mlflow.tracking")

TINY = ["--train-samples", "64", "--test-samples", "32", "--batch-size", "16", "--quiet"]


def records(out: Path, event: str) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def mlflow_run(uri: str, experiment: str = "polytrain") -> tuple[Any, Any]:
    """The client and the one run of ``experiment`` in the store at ``uri``."""
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {uri}"
    (run,) = client.search_runs([found.experiment_id])
    return client, run


def artifact_paths(client: Any, run_id: str, path: str | None = None) -> set[str]:
    paths = set()
    for item in client.list_artifacts(run_id, path):
        paths |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return paths


def check_mlflow_run(client: Any, run: Any, out: Path) -> None:
    """Params = the recipe; loss and lr: one value per step, as in metrics.jsonl; the epoch
    records at steps 1, 2, ...; FINISHED."""
    (start,) = records(out, "start")
    steps, epochs = records(out, "step"), records(out, "epoch")
    assert run.data.params == {k: param_text(v) for k, v in start["recipe"].items()}
    assert run.data.tags["polytrain.backend"] == start["backend"]
    assert run.info.status == "FINISHED"
    for key in ("loss", "lr"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(s["global_step"], s[key]) for s in steps]
    for key in ("train_loss", "train_accuracy", "test_accuracy", "samples_per_second"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(e["epoch"] + 1, e[key]) for e in epochs]


def check_csv(out: Path) -> None:
    """steps.csv and epochs.csv hold metrics.jsonl's numbers, row for row."""
    with open(out / "steps.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    steps = records(out, "step")
    assert len(rows) == len(steps) > 0
    for row, step in zip(rows, steps, strict=True):
        assert int(row["global_step"]) == step["global_step"]
        assert (float(row["loss"]), float(row["lr"])) == (step["loss"], step["lr"])
    with open(out / "epochs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    epochs = records(out, "epoch")
    assert [int(r["epoch"]) for r in rows] == [e["epoch"] for e in epochs]
    for row, epoch in zip(rows, epochs, strict=True):
        for key in ("train_loss", "train_accuracy", "test_accuracy", "samples_per_second"):
            assert float(row[key]) == epoch[key]
        assert row["val_accuracy"] == ""  # None: an empty cell


def test_numpy_run_logs_csv_and_mlflow_in_its_out_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    out = tmp_path / "run"
    argv = ["train", "--backend", "numpy", *TINY, "--epochs", "2", "--out", str(out)]
    assert main([*argv, "--log", "csv,mlflow"]) == 0
    check_csv(out)
    client, run = mlflow_run(f"sqlite:///{out}/mlflow.db")
    check_mlflow_run(client, run, out)
    checkpoint = Path(records(out, "end")[0]["checkpoint"]).name
    assert artifact_paths(client, run.info.run_id) == {
        "metrics.jsonl", "curves.png", "steps.csv", "epochs.csv",
        f"checkpoint/{checkpoint}/manifest.json",
        f"checkpoint/{checkpoint}/model.safetensors",
        f"checkpoint/{checkpoint}/optimizer.safetensors",
    }  # fmt: skip
    assert (out / "mlartifacts").is_dir()  # the local store keeps its artifacts in --out


def test_torch_run_logs_to_the_users_tracking_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)  # a bare store URI keeps artifacts in ./mlruns (MLflow's rule)
    uri = f"sqlite:///{tmp_path}/team.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "lenet-study")
    out = tmp_path / "run"
    argv = ["train", "--backend", "torch", *TINY, "--epochs", "1", "--out", str(out)]
    assert main([*argv, "--no-fast", "--log", "mlflow,csv"]) == 0
    assert not (out / "mlflow.db").exists()
    client, run = mlflow_run(uri, "lenet-study")
    check_mlflow_run(client, run, out)
    check_csv(out)
    assert "metrics.jsonl" in artifact_paths(client, run.info.run_id)


def test_a_resumed_run_continues_its_mlflow_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume in the same --out logs into the first run's MLflow run: one run, every
    step once in one series, the recipe change tagged; --overwrite starts a new run."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    out = tmp_path / "run"
    argv = ["train", "--backend", "numpy", *TINY, "--out", str(out), "--log", "mlflow"]
    assert main([*argv, "--epochs", "1"]) == 0
    assert main([*argv, "--epochs", "2", "--resume", str(out)]) == 0
    client, run = mlflow_run(f"sqlite:///{out}/mlflow.db")  # one run, not two
    assert run.info.status == "FINISHED"
    steps = records(out, "step")
    assert [s["global_step"] for s in steps] == list(range(1, 9))  # 2 epochs x 4 steps
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s["global_step"], s["loss"]) for s in steps]
    assert run.data.params["epochs"] == "1"  # MLflow params cannot change
    assert run.data.tags["polytrain.resumed_at_step"] == "4"
    assert run.data.tags["polytrain.resume_changes"] == "epochs: 1 -> 2"
    assert main([*argv, "--epochs", "1", "--overwrite"]) == 0  # a fresh start: a new run
    found = client.get_experiment_by_name("polytrain")
    assert len(client.search_runs([found.experiment_id])) == 2


@pytest.mark.parametrize(
    ("log", "message"),
    [
        ("csv,wandb", r"--log wandb: unknown tracker; choose from csv, mlflow, tensorboard"),
        ("mlflow", r"--log mlflow needs the mlflow package: pip install 'polytrain\[mlflow\]'"),
    ],
)
def test_unknown_or_missing_tracker_is_one_line_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    log: str,
    message: str,
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # how Python marks a module missing
    out = tmp_path / "run"
    assert main(["train", "--backend", "numpy", *TINY, "--out", str(out), "--log", log]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not (out / "metrics.jsonl").exists()


def test_the_recipe_file_key_and_overwrite(tmp_path: Path) -> None:
    """``log = [...]`` in a recipe file; tensorboard goes to --out/tensorboard; --overwrite
    starts the CSV files anew."""
    config = tmp_path / "recipe.toml"
    config.write_text('log = ["csv", "tensorboard"]\nepochs = 1\n')
    out = tmp_path / "run"
    argv = ["train", "--config", str(config), "--backend", "numpy", *TINY, "--out", str(out)]
    assert main(argv) == 0
    assert main([*argv, "--overwrite"]) == 0
    check_csv(out)  # one run's rows, not two
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    config.write_text('log = "csv"\nepochs = 1\n')
    assert main([*argv, "--overwrite"]) == 0
    check_csv(out)
    assert not (out / "mlflow.db").exists()
