"""metrics.jsonl as a run goes: step lines reach the file within ``flush_seconds``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from polytrain.plugins.records import RunInfo, StepRecord
from polytrain.training.builtin_plugins import JsonlLogger

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
