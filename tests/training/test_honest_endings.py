"""A failed run is never "completed" (docs/reliability.md, "A failed run never says
completed"): the last update is judged by its tensors, the evaluation by its numbers, a
stop signal is honoured between evaluation batches, a user plugin that raises is one line
naming it and the intact checkpoint, and a damaged manifest is one line naming the key."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain import hookimpl
from polytrain.cli.main import main
from polytrain.errors import CheckpointError, NonFiniteLossError
from polytrain.io.checkpoint import CheckpointManager, load_checkpoint
from polytrain.plugins.records import StepRecord
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

HERE = Path(__file__).parent
# one step of 32 samples: the run's only update is its last
ONE_STEP = ["--train-samples", "32", "--test-samples", "32", "--batch-size", "32",
            "--epochs", "1", "--quiet"]  # fmt: skip


def events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# -- the last update, the evaluation ----------------------------------------------------------


@pytest.mark.slow
def test_a_last_update_that_overflows_is_never_completed_nor_latest(
    backend_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"  # lr 1e308: a finite loss, then every weight NaN/Inf
    assert (
        main(["train", "--backend", backend_name, *ONE_STEP, "--lr", "1e308", "--out", str(out)])
        == 2
    )
    err = one_line(capsys)
    assert "after global step 1" in err and "NaN/Inf in 8 of 8 parameter tensors" in err, err
    assert "No checkpoint was taken before it went wrong" in err and "--overwrite" in err
    assert CheckpointManager(out).latest() is None  # nothing to resume by mistake
    aside = load_checkpoint(out / "checkpoints" / "diverged" / "step-00000001")
    assert not all(np.isfinite(p).all() for p in aside.params.values())  # kept to inspect
    assert events(out)[-1]["stop_reason"] == "failed: NonFiniteLossError"


@pytest.mark.slow
def test_the_last_partial_accumulated_batch_is_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"  # 56 samples: a batch of 32, then the last one of 24 (micro-batches
    # of 6), whose update alone overflows: the lr jumps by 1e300 after step 1
    args = [*ONE_STEP, "--train-samples", "56", "--accumulate", "4", "--lr", "0.01",
            "--schedule", "step:step_size=1,gamma=1e300"]  # fmt: skip
    assert main(["train", "--backend", "numpy", *args, "--out", str(out)]) == 2
    assert "after global step 2" in one_line(capsys)
    assert CheckpointManager(out).latest() is None


@pytest.mark.slow
def test_without_out_the_parameters_are_judged_at_the_end() -> None:
    recipe = Recipe(train_samples=32, test_samples=32, batch_size=32, epochs=1, lr=1e308)
    with pytest.raises(NonFiniteLossError, match="NaN/Inf in 8 of 8 parameter tensors"):
        Trainer(recipe, "numpy", progress=False).fit()


def test_a_non_finite_evaluation_stops_the_run(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((32, 1, 28, 28), dtype=np.float32)
    y = rng.random((32, 10), dtype=np.float32)
    huge = np.full_like(x, 3e38)  # finite inputs whose outputs overflow float32
    recipe = Recipe(model="mlp", loss="mse", metric="mse", batch_size=32, epochs=1)
    trainer = Trainer(
        recipe, "numpy", datasets={"train": (x, y), "test": (huge, y)}, out_dir=tmp_path / "run",
        progress=False,
    )  # fmt: skip
    with pytest.raises(NonFiniteLossError, match=r"the test mse of the evaluation is (nan|inf)"):
        trainer.fit()
    assert CheckpointManager(tmp_path / "run").latest() is None
    assert (tmp_path / "run" / "checkpoints" / "diverged" / "step-00000001").is_dir()


# -- SIGTERM during the evaluation ------------------------------------------------------------


class TermDuringEvaluation:
    """Sends its own process SIGTERM once the main thread runs an evaluation batch (a
    watcher thread reads the main thread's stack): the signal lands mid-evaluation."""

    @hookimpl
    def polytrain_train_start(self) -> None:
        main_thread = threading.main_thread().ident

        def in_evaluation() -> bool:
            frame = sys._current_frames().get(main_thread or 0)
            while frame is not None:
                if frame.f_code.co_name == "eval_batch":
                    return True
                frame = frame.f_back
            return False

        def watch() -> None:
            while not in_evaluation():
                time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True).start()


@pytest.mark.slow
def test_sigterm_during_the_evaluation_stops_between_batches(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "polytrain", "train", "--backend", "numpy", "--train-samples",
           "64", "--test-samples", "5000", "--batch-size", "32", "--epochs", "1", "--quiet",
           "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    plugin = ["--plugin", "test_honest_endings:TermDuringEvaluation"]
    done = subprocess.run([*cmd, *plugin], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    err = done.stderr.strip()
    assert "interrupted by SIGTERM during the evaluation of epoch 1: evaluated " in err, err
    found = re.search(r"evaluated (\d+) of 5,000 test samples \(test accuracy so far ", err)
    assert found is not None, err  # in batches of the training batch, 32: the stop is prompt
    assert int(found[1]) % 32 == 0 and 0 < int(found[1]) < 5000, err
    latest = CheckpointManager(out).latest()
    assert latest is not None and str(latest) in err
    assert load_checkpoint(latest).position == {"epoch": 0, "step": 2, "global_step": 2}
    assert f"evaluated {found[1]} of 5,000" in events(out)[-1]["stop_reason"]  # the record

    resumed = subprocess.run([*cmd, "--resume", str(out), "--json"], capture_output=True,
                             text=True, env=env, check=False)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["stop_reason"] == "completed" and summary["final_step"] == 2  # no step redone
    assert summary["final"]["test_metric"] is not None  # the whole test set, this time


# -- a user plugin that raises ----------------------------------------------------------------


class RaiseAtStep3:
    """Named by ``--plugin test_honest_endings:RaiseAtStep3``."""

    @hookimpl
    def polytrain_step_end(self, step: StepRecord) -> None:
        if step.global_step == 3:
            raise RuntimeError("no metric server at step 3")


@pytest.mark.slow
def test_a_plugin_that_raises_is_one_line_naming_it_and_the_intact_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    args = ["train", "--backend", "numpy", *ONE_STEP, "--train-samples", "160",
            "--checkpoint-every", "2", "--plugin", "test_honest_endings:RaiseAtStep3"]  # fmt: skip
    assert main([*args, "--out", str(out)]) == 2
    err = one_line(capsys)
    assert "plugin test_honest_endings:RaiseAtStep3 raised RuntimeError: no metric server" in err
    assert "polytrain_step_end at global step 3" in err and "--debug" in err
    intact = out / "checkpoints" / "step-00000002"
    assert f"The checkpoint {intact} is intact" in err and f"--resume {out}" in err
    assert load_checkpoint(out).path == intact

    monkeypatch.setenv("POLYTRAIN_DEBUG", "1")  # --debug: the plugin's own traceback first
    assert main([*args, "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise RuntimeError("no metric server at step 3")' in err
    assert err.strip().splitlines()[-1].startswith("polytrain train: error: plugin ")


# -- damaged manifests ------------------------------------------------------------------------


def _set(manifest: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        manifest = manifest[int(key) if key.isdigit() else key]
    if value is KeyError:
        del manifest[last]
    else:
        manifest[last] = value


MANIFEST_CASES = [  # (key, value, what the line says); each gave a traceback or went unseen
    ("optimizer.step", "x", "optimizer.step must be a whole number"),
    ("optimizer.lr", "0.1", "optimizer.lr must be a finite number >= 0"),
    ("optimizer.step", -1, "optimizer.step must be a whole number"),
    ("position.global_step", 10**30, "position.global_step must be a whole number in 0..2**53"),
    ("history.0.train_loss", None, "history[0].train_loss must be a finite number, not None"),
    ("history.0.test_accuracy", "x", "history[0].test_accuracy must be a finite number or null"),
    ("history.0.epoch", KeyError, "history[0].epoch is missing"),
]
RESUME_CASES = [  # the trainer's own fields, read on --resume
    ("optimizer.config", {}, "optimizer.config.name is missing"),
    ("extra.partial_epoch.loss_sum", "x", "extra.partial_epoch.loss_sum must be a finite number"),
    ("extra.health", "x", "extra.health must be an object"),
    ("extra.control.lr", "fast", "extra.control.lr must be a finite number >= 0 or null"),
]


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("manifest") / "run"
    assert main(["train", "--backend", "numpy", *ONE_STEP, "--out", str(out)]) == 0
    return out


def _damaged(run: Path, tmp_path: Path, key: str, value: Any) -> Path:
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run), str(copy)], check=True)
    ck = copy / "checkpoints" / "step-00000001"
    manifest = json.loads((ck / "manifest.json").read_text())
    _set(manifest, key, value)
    (ck / "manifest.json").write_text(json.dumps(manifest))
    return ck


@pytest.mark.slow
@pytest.mark.parametrize(("key", "value", "says"), MANIFEST_CASES + RESUME_CASES)
def test_a_damaged_manifest_is_one_line_naming_the_file_and_the_key(
    checkpointed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    key: str, value: Any, says: str,
) -> None:  # fmt: skip
    ck = _damaged(checkpointed, tmp_path, key, value)
    capsys.readouterr()
    resume = ["train", "--backend", "numpy", "--resume", str(ck), "--epochs", "2", "--quiet"]
    readers: list[Callable[[], int]] = [lambda: main([*resume, "--out", str(ck.parent.parent)])]
    if (key, value, says) in MANIFEST_CASES:
        readers.append(lambda: main(["convert", str(ck), str(tmp_path / "w.npz"), "--to", "numpy"]))
        with pytest.raises(CheckpointError, match=says.replace("[", r"\[").replace("*", r"\*")):
            load_checkpoint(ck)
    for read in readers:
        assert read() == 2
        err = one_line(capsys)
        assert f"{ck / 'manifest.json'} is malformed: {says}" in err, err
