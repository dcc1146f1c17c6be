"""polytrain's launcher program for engines that ship none (``polytrain.distributed.spawn``,
the jax backend's): each worker's variables, and a failure stopping the others."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

SPAWN = [sys.executable, "-m", "polytrain.distributed.spawn"]
ARGS = ["--nproc-per-node", "2", "--node-rank", "1", "--nnodes", "2",
        "--master", "10.0.0.1:29500", "--prefix", "T_"]  # fmt: skip


def worker(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


def test_each_worker_gets_its_rank_and_the_master(tmp_path: Path) -> None:
    names = ("T_RANK", "T_WORLD_SIZE", "T_LOCAL_WORLD_SIZE", "T_NODE_RANK", "T_NNODES",
             "MASTER_ADDR", "MASTER_PORT")  # fmt: skip
    code = (
        f"import os; e = os.environ; path = os.path.join({str(tmp_path)!r}, e['T_LOCAL_RANK']); "
        f"open(path, 'w').write(' '.join(e[k] for k in {names!r}))"
    )
    assert subprocess.run([*SPAWN, *ARGS, *worker(code)], timeout=60).returncode == 0
    assert (tmp_path / "0").read_text() == "2 4 2 1 2 10.0.0.1 29500"
    assert (tmp_path / "1").read_text() == "3 4 2 1 2 10.0.0.1 29500"


@pytest.mark.parametrize("failing", ["0", "1"])
def test_a_failed_worker_stops_the_others_with_its_code(failing: str) -> None:
    """Whichever rank fails first (the watch once polled only up to a running worker)."""
    fail = f"os.environ['T_LOCAL_RANK'] == '{failing}' and exit(3)"
    code = f"import os, time; {fail}; time.sleep(120)"
    start = time.monotonic()
    proc = subprocess.run([*SPAWN, *ARGS, *worker(code)], timeout=100)
    assert proc.returncode == 3
    assert time.monotonic() - start < 60  # the sleeper got SIGTERM, not its 120 s


def test_a_command_is_required() -> None:
    proc = subprocess.run([*SPAWN, *ARGS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "give the command after --" in proc.stderr
