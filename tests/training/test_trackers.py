"""Experiment trackers (``--log csv,mlflow,tensorboard``): real short runs, read back through
MLflow's own client and the csv module, and compared with the run's metrics.jsonl."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
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
    named = {
        "train_loss": "train_loss",
        "train_accuracy": "train_metric",
        "test_accuracy": "test_metric",
        "samples_per_second": "samples_per_second",
    }
    for name, key in named.items():  # MLflow names the metric's series by the metric
        history = client.get_metric_history(run.info.run_id, name)
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
        for key in ("train_loss", "train_metric", "test_metric", "samples_per_second"):
            assert float(row[key]) == epoch[key]
        assert row["val_metric"] == ""  # None: an empty cell
        assert row["metric"] == epoch["metric"] == "accuracy"


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# -- a tracking store that fails or never answers ----------------------------------------


@pytest.fixture
def silent_server() -> Iterator[tuple[str, threading.Event]]:
    """``http://127.0.0.1:PORT`` of a server that accepts connections and never answers,
    and an event set at its first connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    connected = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            while True:
                held.append(listener.accept()[0])
                connected.set()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", connected
    listener.close()
    for conn in held:
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(120)  # before the bounds: 8 tries with backoff, minutes
def test_a_tracking_server_that_never_answers_turns_mlflow_off(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    silent_server: tuple[str, threading.Event],
) -> None:
    """MLflow's waits are bounded (the user's timeout, polytrain's retry count), then one
    line says MLflow is off, and the run goes on and completes."""
    uri, _ = silent_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    out = tmp_path / "run"
    argv = ["train", "--backend", "numpy", *TINY, "--epochs", "1", "--out", str(out)]
    assert main([*argv, "--log", "mlflow"]) == 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "polytrain: --log mlflow: starting the MLflow run failed: no answer within "
        "MLFLOW_HTTP_REQUEST_TIMEOUT=1 s, MLFLOW_HTTP_REQUEST_MAX_RETRIES=1 "
        f"(store {uri}); training goes on without MLflow"
    ]
    assert len(records(out, "epoch")) == 1
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # polytrain's bound, put back


@pytest.mark.slow
def test_sigterm_while_waiting_on_the_tracking_server(
    tmp_path: Path, silent_server: tuple[str, threading.Event]
) -> None:
    """A SIGTERM ends the wait at once (even with MLflow's 120 s per request): the
    tracker says it is off, the Trainer saves and polytrain exits 143 with its line."""
    uri, connected = silent_server
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_HTTP_REQUEST_TIMEOUT": "120"}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "polytrain", "train", "--backend", "numpy", *TINY, "--epochs",
           "1", "--out", str(out), "--log", "mlflow"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert connected.wait(120), "polytrain never reached the tracking server"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[0] == (
        "polytrain: --log mlflow: starting the MLflow run was stopped by SIGTERM "
        f"(store {uri}); MLflow is off"
    )
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"polytrain train: interrupted by SIGTERM; checkpoint {out}")
    )


@pytest.mark.parametrize("store", ["file:{tmp}/store", "{tmp}/store"])
def test_an_mlflow_file_store_is_one_line_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    store: str,
) -> None:
    """MLflow 3 refuses its file store with a traceback; polytrain says so in one line,
    with the SQLite URI to use, before training."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.format(tmp=tmp_path))
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    out = tmp_path / "run"
    argv = ["train", "--backend", "numpy", *TINY, "--epochs", "1", "--out", str(out)]
    assert main([*argv, "--log", "mlflow"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("polytrain train: error: MLFLOW_TRACKING_URI=") and "file store" in line
    assert f"MLFLOW_TRACKING_URI=sqlite:///{tmp_path}/store/mlflow.db" in line, line
    assert not (out / "metrics.jsonl").exists()
