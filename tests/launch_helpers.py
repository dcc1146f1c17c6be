"""Helpers shared by the multi-process tests (test_distributed.py, test_netns.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "workers" / "dist_steps.py"
POLYTRAIN = [sys.executable, "-m", "polytrain"]
# Variables of an outer launcher that would make a test's processes join the wrong job.
_LAUNCHER_PREFIXES = ("DMLC_", "PADDLE_", "SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "POLYTRAIN_")
_LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")  # fmt: skip


def launchable_backends() -> list[str]:
    """The backends under test whose plugin's launcher starts several processes (the
    numpy backend's says it runs in one)."""
    from polytrain.plugins.registry import registered_launchers
    from polytrain.testing import backends_under_test

    launchers = registered_launchers()
    return [b for b in backends_under_test() if b in launchers and not launchers[b].unsupported]


def clean_env() -> dict[str, str]:
    """This process's environment without launcher variables; one thread per process."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_NAMES
    }
    env.update(POLYTRAIN_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if "POLYTRAIN_DATA" in os.environ:
        env["POLYTRAIN_DATA"] = os.environ["POLYTRAIN_DATA"]
    return env


def launch_command(
    backend: str,
    master: str,
    log_dir: Path,
    command: list[str],
    *,
    nproc: int = 2,
    nnodes: int = 1,
    node_rank: int = 0,
    timeout: float | None = None,
) -> list[str]:
    """``polytrain launch ... -- command`` as an argument list."""
    cmd = [*POLYTRAIN, "launch", "--backend", backend, "--nproc-per-node", str(nproc),
           "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master", master,
           "--log-dir", str(log_dir)]  # fmt: skip
    if timeout is not None:
        cmd += ["--timeout", str(timeout)]
    return [*cmd, "--", *command]


def steps_command(backend: str, out: Path, steps: int = 5, precision: str = "fp32") -> list[str]:
    """The LeNet worker: ``steps`` steps on its rank's slice, parameters to out/rank<R>.npz."""
    return [str(WORKER), backend, str(out), str(steps), precision]


def reference_params(
    backend: str, out: Path, steps: int = 5, precision: str = "fp32"
) -> dict[str, np.ndarray]:
    """One process on the full batch (the same worker, no launcher)."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, *steps_command(backend, out, steps, precision)],
        env=clean_env(),
        check=True,
        timeout=300,
    )
    return load_npz(out / "rank0.npz")


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def max_param_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest absolute difference over every parameter (losses excluded)."""
    assert set(a) == set(b)
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a if k != "losses")


def output_of(proc: subprocess.CompletedProcess[str]) -> str:
    return f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def log_text(log_dir: Path) -> str:
    """Every log file of a launch, for failure messages."""
    parts = []
    for path in sorted(log_dir.glob("*log*")):
        if path.is_file():
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)
