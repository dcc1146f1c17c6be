"""The torch backend keeps the CPU memory torch frees for the next step (glibc's malloc
thresholds, ``polytrain_torch/_malloc.py``): a LeNet training step faults almost no pages
in, where glibc's default faults in thousands; a user's own choice of thresholds wins."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from polytrain.errors import BackendError

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# LeNet, batch 256, eager SGD steps through polytrain; prints the backend's malloc state
# and the median minor page faults of a step (the heap still grows now and then in the
# first steps: ~2,000 faults in one of them)
STEPS = """
import resource
import numpy as np
from polytrain import get_backend
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.training.step import StepRunner
b = get_backend("torch", threads=1)
model = b.build_model(get_model_spec("lenet"))
runner = StepRunner(b, model, b.make_optimizer(model, OptimizerConfig("momentum", lr=0.05)))
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 1, 28, 28)).astype(np.float32)
y = rng.integers(0, 10, 256).astype(np.int64)
faults = []
for _ in range(10):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    runner.train_step(x.copy(), y)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
faults = sorted(faults[2:])[4]  # the median step after two warm-up ones
print(b.malloc, "|", faults)
"""


def _run(env: dict[str, str]) -> tuple[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    clean.pop("POLYTRAIN_TORCH_MALLOC", None)
    proc = subprocess.run(
        [sys.executable, "-c", STEPS],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    state, faults = proc.stdout.strip().splitlines()[-1].split(" | ")
    return state, float(faults)


@pytest.mark.slow
@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_a_training_step_reuses_freed_memory() -> None:
    state, faults = _run({})
    system_state, system_faults = _run({"POLYTRAIN_TORCH_MALLOC": "system"})
    assert state == "reuse"
    assert system_state == "system: POLYTRAIN_TORCH_MALLOC=system"
    # measured: ~13,000 faults per step with glibc's defaults, a few dozen with reuse
    assert system_faults > 2000, "the premise: glibc's defaults fault the step's pages in"
    assert faults < system_faults / 10


@pytest.mark.slow
@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MALLOC_MMAP_THRESHOLD_", "1048576"),
        ("MALLOC_TRIM_THRESHOLD_", "1048576"),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576"),
    ],
)
def test_the_users_thresholds_win(name: str, value: str) -> None:
    state, _ = _run({name: value})
    assert state == f"system: the user set {name}"


def test_a_bad_mode_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from polytrain_torch import _malloc

    monkeypatch.setenv("POLYTRAIN_TORCH_MALLOC", "jemalloc")
    with pytest.raises(BackendError, match="must be 'reuse' or 'system', got 'jemalloc'"):
        _malloc._apply()
