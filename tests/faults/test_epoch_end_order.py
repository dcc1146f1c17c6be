"""An epoch's end writes its record and runs the plugins' epoch hooks before its
checkpoint: a kill right after that checkpoint keeps the epoch's record, and a plugin's
learning rate set at the epoch's end is in the checkpoint a resume starts from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from polytrain import hookimpl
from polytrain.cli.main import main
from polytrain.plugins.control import TrainControl
from polytrain.training.builtin_plugins import read_metrics

RUN = ["--backend", "numpy", "--train-samples", "64", "--test-samples", "32", "--batch-size",
       "32", "--quiet"]  # fmt: skip

KILL_AT_FIRST_CHECKPOINT = """
import os, signal
import polytrain

class Kill:
    @polytrain.hookimpl
    def polytrain_checkpoint_saved(self, global_step):
        os.kill(os.getpid(), signal.SIGKILL)
"""


def epoch_records(run: Path) -> list[int]:
    return [r["epoch"] for r in read_metrics(run / "metrics.jsonl") if r["event"] == "epoch"]


def test_a_kill_right_after_the_epochs_checkpoint_keeps_its_record(tmp_path: Path) -> None:
    (tmp_path / "kill_plugin.py").write_text(KILL_AT_FIRST_CHECKPOINT)
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    argv = ["train", *RUN, "--epochs", "2", "--out", str(run), "--plugin", "kill_plugin:Kill"]
    proc = subprocess.run([sys.executable, "-m", "polytrain", *argv], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert epoch_records(run) == [0, 1]


class LowerAtEpochEnd:
    """A plateau-style plugin: the learning rate it sets at the epoch's end holds on."""

    @hookimpl
    def polytrain_epoch_end(self, control: TrainControl) -> None:
        control.lr = 0.0125


def test_a_plugins_epoch_end_learning_rate_survives_a_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = ["train", *RUN, "--epochs", "1", "--out", str(run), "--plugin",
            "test_epoch_end_order:LowerAtEpochEnd"]  # fmt: skip
    assert main(argv) == 0
    assert main(["train", "--resume", str(run), "--epochs", "2", "--quiet"]) == 0
    lrs = [r["lr"] for r in read_metrics(run / "metrics.jsonl") if r["event"] == "step"]
    assert lrs[2:] == [0.0125, 0.0125]  # epoch 2's steps, after the resume
