"""Rank 0's output reaches the console under ``polytrain launch --log-dir``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polytrain.distributed.console_tail import FollowLog
from polytrain.testing import backends_under_test


def _follow(path: Path, write: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with FollowLog(path, out, interval=0.01):
        for how, data in write:
            if how == "append":
                with open(path, "ab") as fh:
                    fh.write(data)
            else:  # "replace": a new file renamed into place (MXNet's slot log)
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(data)
                tmp.replace(path)
            time.sleep(0.05)
    return out.getvalue()


def test_a_log_that_appears_later_is_followed_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "workerlog.0"
    assert _follow(log, [("append", b"step 1\n"), ("append", b"step 2\n")]) == b"step 1\nstep 2\n"


def test_an_earlier_runs_log_is_not_replayed(tmp_path: Path) -> None:
    log = tmp_path / "workerlog.0"
    log.write_bytes(b"old run\n")
    assert _follow(log, [("append", b"new run\n")]) == b"new run\n"


def test_a_log_renamed_into_place_is_followed_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "workerlog.0"
    log.write_bytes(b"old run\n")
    got = _follow(log, [("replace", b"joined as rank 0\n"), ("append", b"step 1\n")])
    assert got == b"joined as rank 0\nstep 1\n"


@pytest.mark.slow
@pytest.mark.skipif("torch" not in backends_under_test(), reason="needs torch")
def test_launch_shows_rank_zero_on_the_console(tmp_path: Path) -> None:
    code = "import os; print('hello from rank', os.environ['RANK'])"
    proc = subprocess.run(
        [sys.executable, "-m", "polytrain", "launch", "--backend", "torch", "--nproc-per-node",
         "2", "--log-dir", str(tmp_path), "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hello from rank 0" in proc.stdout
    assert "hello from rank 1" not in proc.stdout + proc.stderr  # only in workerlog.1
    assert (tmp_path / "workerlog.1").read_text().strip() == "hello from rank 1"
