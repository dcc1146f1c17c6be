"""Two processes on gloo through ``polytrain launch``: the backend makes its device
current before the process group exists, and gradients summed in flat buckets equal
one collective per parameter after 20 steps (torch and Paddle; MXNet syncs through its
parameter server, key by key)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from launch_helpers import REPO, clean_env, launch_command, launchable_backends, log_text, output_of

from polytrain.distributed.network import free_port

pytestmark = pytest.mark.slow

WORKER = REPO / "tests" / "workers" / "bucket_steps.py"
BUCKETED = [b for b in ("torch", "paddle") if b in launchable_backends()]


@pytest.mark.parametrize("backend", BUCKETED)
def test_device_before_group_and_buckets_equal_per_parameter(backend: str, tmp_path: Path) -> None:
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    command = launch_command(
        backend, f"127.0.0.1:{free_port()}", logs, [str(WORKER), backend, str(out)]
    )
    proc = subprocess.run(
        command, env=clean_env(), capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, output_of(proc) + log_text(logs)
    ranks = [dict(np.load(out / f"rank{r}.npz")) for r in (0, 1)]
    for rank in ranks:
        assert rank.pop("group_at_set").tolist() == [False]  # set once, before the group
    names = [k.split("/", 1)[1] for k in ranks[0] if k.startswith("per_parameter/")]
    for path in ("small_buckets", "default"):
        diff = max(
            float(np.max(np.abs(r[f"{path}/{n}"] - ranks[0][f"per_parameter/{n}"])))
            for r in ranks
            for n in names
        )
        print(f"{backend} {path}: max |diff| to per-parameter sync after 20 steps {diff:.1e}")
        assert diff <= 1e-6
