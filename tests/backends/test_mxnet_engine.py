"""MXNet's engine: NaiveEngine on every core for one polytrain process, the threaded engine
with one core less where the user chose it or a parameter-server launch runs the process
(backends/polytrain_mxnet/_engine.py; figures in docs/performance.md, "MXNet's engine")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polytrain.utils.threads import cpu_count

pytest.importorskip("mxnet")
from polytrain_mxnet import _engine

CLEAN = (
    *("MXNET_ENGINE_TYPE", _engine.CHOSEN_VAR, "DMLC_ROLE", "POLYTRAIN_THREADS"),
    *("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MXNET_OMP_MAX_THREADS"),
)


def _train(tmp_path: Path, name: str, **env: str) -> tuple[dict, str, list[float]]:
    """A 4-step ``polytrain train`` on MXNet in a fresh process: the threads of its run
    header, its stderr and its per-step losses."""
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    cmd = [sys.executable, "-m", "polytrain", "train", "--backend", "mxnet", "--epochs", "1",
           "--max-steps", "4", "--batch-size", "64", "--out", str(tmp_path / name)]  # fmt: skip
    run = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    text = (tmp_path / name / "metrics.jsonl").read_text(encoding="utf-8")
    records = [json.loads(ln) for ln in text.splitlines()]
    losses = [r["loss"] for r in records if r["event"] == "step"]
    return records[0]["threads"], run.stderr, losses


@pytest.mark.slow
def test_one_process_runs_naive_engine_on_every_core_with_the_same_numbers(
    tmp_path: Path,
) -> None:
    threads, stderr, losses = _train(tmp_path, "naive")
    assert threads == {"intra_op": cpu_count(), "engine_workers": 0}
    assert "start using engine" not in stderr  # MXNet's log line for a set engine is dropped
    threads, _, threaded = _train(tmp_path, "threaded", MXNET_ENGINE_TYPE=_engine.THREADED)
    assert threads == {"intra_op": max(1, cpu_count() - 1), "engine_workers": 1}
    assert len(losses) == len(threaded) == 4
    assert losses == pytest.approx(threaded, abs=1e-5)  # float32, other thread counts


def test_the_users_engine_and_a_launched_worker_keep_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in CLEAN:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "mxnet")  # as if not imported yet; restored after
    monkeypatch.setenv("MXNET_ENGINE_TYPE", _engine.THREADED)
    assert _engine.choose_engine() == 1 and os.environ["MXNET_ENGINE_TYPE"] == _engine.THREADED
    monkeypatch.delenv("MXNET_ENGINE_TYPE")
    monkeypatch.setenv("DMLC_ROLE", "worker")  # polytrain launch's parameter-server worker
    assert _engine.choose_engine() == 1 and "MXNET_ENGINE_TYPE" not in os.environ
    monkeypatch.delenv("DMLC_ROLE")
    assert _engine.choose_engine() == 0
    assert os.environ["MXNET_ENGINE_TYPE"] == os.environ[_engine.CHOSEN_VAR] == _engine.NAIVE


def test_an_imported_mxnet_keeps_the_engine_it_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in CLEAN:
        monkeypatch.delenv(var, raising=False)
    assert "mxnet" in sys.modules
    assert _engine.choose_engine() == 1 and "MXNET_ENGINE_TYPE" not in os.environ


def test_a_launch_does_not_hand_polytrains_choice_to_its_workers() -> None:
    chosen = {"MXNET_ENGINE_TYPE": _engine.NAIVE, _engine.CHOSEN_VAR: _engine.NAIVE, "A": "1"}
    assert _engine.launched_env(chosen) == {"A": "1"}
    users = {"MXNET_ENGINE_TYPE": _engine.NAIVE, "A": "1"}  # the user's own: kept
    assert _engine.launched_env(users) == users
