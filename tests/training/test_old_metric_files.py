"""Files of runs written before the epoch record's metric fields were renamed
(``test_accuracy`` -> ``test_metric``, ``partial_epoch.correct`` -> ``metric_sum``) still
read: tests/fixtures/old_metric_keys holds such a run (its README says how it was made)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from polytrain.cli.main import main
from polytrain.parity.compare import diff_pair, parse_run
from polytrain.parity.results import Tolerances
from polytrain.plugins.records import EpochRecord
from polytrain.training.builtin_plugins import read_metrics
from polytrain.training.keep_best import KeepBest

OLD_RUN = Path(__file__).parents[1] / "fixtures" / "old_metric_keys"


def old_epochs() -> list[dict[str, float]]:
    return [r for r in read_metrics(OLD_RUN / "metrics.jsonl") if r["event"] == "epoch"]


def test_an_old_mid_epoch_checkpoint_resumes_to_the_numbers_of_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its history and its epoch's metric sum so far (``correct``) carry on: the resumed
    epoch 2 is the one the old run trained, and epochs.csv goes on with its old columns."""
    run = shutil.copytree(OLD_RUN, tmp_path / "run")
    monkeypatch.chdir(run)  # the recipe names net.json and data.npz as given then
    checkpoint = "checkpoints/step-00000004"
    argv = ["train", "--backend", "numpy", "--resume", checkpoint, "--out", ".", "--json",
            "--quiet", "--log", "csv"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    keys = ("train_loss", "train_metric", "test_metric", "val_metric")
    got = [[e[k] for k in keys] for e in summary["epochs"]]
    old = [[e[k.replace("metric", "accuracy")] for k in keys] for e in old_epochs()]
    assert got == old
    assert [e["metric"] for e in summary["epochs"]] == ["accuracy", "accuracy"]
    with open("epochs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["epoch"], float(r["test_accuracy"])) for r in rows] == [
        ("0", old[0][2]),
        ("1", old[1][2]),
    ]  # fmt: skip  (the old run's row of epoch 1, which the resume redid, is replaced)


def test_an_old_metrics_file_reads_into_a_comparison() -> None:
    run = parse_run("numpy", read_metrics(OLD_RUN / "metrics.jsonl"))
    assert [e["test_metric"] for e in run.epochs] == [e["test_accuracy"] for e in old_epochs()]
    assert run.final["metric"] == "accuracy" and "test_accuracy" not in run.final
    assert diff_pair(run, run, Tolerances()).test_accuracy_diff_points == 0.0


def test_an_old_epoch_record_reads_under_the_new_names_and_the_run_s_metric() -> None:
    manifest = json.loads((OLD_RUN / "checkpoints/step-00000004/manifest.json").read_text())
    record = EpochRecord.from_dict(manifest["history"][0], "mse")
    assert (record.train_metric, record.test_metric, record.val_metric) == (
        0.5208333333333334, 0.34375, 0.5
    )  # fmt: skip
    assert record.metric == "mse"
    assert record.named_numbers()["test_mse"] == 0.34375  # what trackers log it as
    assert record.test_accuracy == record.test_metric  # the old attribute still reads


def test_keep_best_takes_the_old_field_names() -> None:
    assert KeepBest("test_accuracy").metric == "test_metric"
    assert KeepBest("val_metric").metric == "val_metric"
