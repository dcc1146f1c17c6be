"""metrics.jsonl as a run goes: step lines reach the file within ``flush_seconds`` and at
each checkpoint; a resume drops the lines of what it redoes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from polytrain.plugins.records import RunInfo, StepRecord
from polytrain.training.builtin_plugins import JsonlLogger, read_metrics

RUN = RunInfo(backend="numpy", framework_version="1", model="mlp", dataset="synthetic",
              devices=["cpu"], epochs=1, steps_per_epoch=1000, global_batch=32,
              per_device_batch=32)  # fmt: skip


def step(n: int) -> StepRecord:
    return StepRecord(epoch=0, step=n, global_step=n, loss=1.0, lr=0.1, samples=32)


def lines(log: JsonlLogger) -> int:
    return len(log.path.read_text().splitlines())


@pytest.fixture
def log(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[JsonlLogger]:
    logger = JsonlLogger(tmp_path / "metrics.jsonl", flush_seconds=request.param)
    logger.polytrain_train_start(RUN)
    yield logger
    assert logger._fh is not None
    logger._fh.close()


@pytest.mark.parametrize("log", [1.0, 3600.0], indirect=True)
def test_first_step_line_is_on_disk_at_once(log: JsonlLogger) -> None:
    log.polytrain_step_end(RUN, step(1))
    assert lines(log) == 2  # a watcher (tail -f, a signal test) sees the run start


@pytest.mark.parametrize("log", [3600.0], indirect=True)
def test_later_step_lines_wait_for_the_interval(log: JsonlLogger) -> None:
    for n in range(1, 4):
        log.polytrain_step_end(RUN, step(n))
    assert lines(log) == 2  # one write per interval, not one per step


@pytest.mark.parametrize("log", [0.0], indirect=True)
def test_zero_interval_flushes_every_step(log: JsonlLogger) -> None:
    for n in range(1, 4):
        log.polytrain_step_end(RUN, step(n))
    assert lines(log) == 4


@pytest.mark.parametrize("log", [3600.0], indirect=True)
def test_a_checkpoint_puts_every_step_before_it_on_disk(log: JsonlLogger) -> None:
    for n in range(1, 4):
        log.polytrain_step_end(RUN, step(n))
    log.polytrain_checkpoint_saved()
    assert lines(log) == 4  # a kill now loses no step the checkpoint holds


def test_a_resume_drops_the_lines_of_what_it_redoes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = JsonlLogger(path)
    first.polytrain_train_start(RUN)
    for n in range(1, 6):  # killed after step 5; its last checkpoint: step 3
        first.polytrain_step_end(RUN, step(n))
    assert first._fh is not None
    first._fh.close()
    with open(path, "a") as fh:
        fh.write('{"event": "step", "glo')  # the kill cut a line
    resumed = JsonlLogger(path)
    resumed.polytrain_train_start(replace(RUN, start_step=3, start_global_step=3))
    resumed.polytrain_step_end(RUN, step(4))
    assert resumed._fh is not None
    resumed._fh.close()
    records = read_metrics(path)
    assert [r["event"] for r in records] == ["start", "step", "step", "step", "start", "step"]
    assert [r["global_step"] for r in records if r["event"] == "step"] == [1, 2, 3, 4]
