"""The numpy backend keeps the memory numpy frees for the next step (glibc's malloc
thresholds, ``polytrain.utils.malloc``): a LeNet training step faults almost no pages in,
where glibc's defaults fault in thousands; one process's backends never lower the
threshold another set."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from polytrain.errors import BackendError

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# LeNet, batch 256, Adam steps through polytrain; prints the backend's malloc state and
# the median minor page faults of a step after two warm-up ones
STEPS = """
import resource
import numpy as np
from polytrain import get_backend
from polytrain.neutral.models import get_model_spec
from polytrain.neutral.optim import OptimizerConfig
from polytrain.training.step import StepRunner
b = get_backend("numpy", threads=1)
model = b.build_model(get_model_spec("lenet"))
runner = StepRunner(b, model, b.make_optimizer(model, OptimizerConfig("adam", lr=0.002)))
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 1, 28, 28)).astype(np.float32)
y = rng.integers(0, 10, 256).astype(np.int64)
faults = []
for _ in range(7):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    runner.train_step(x.copy(), y)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
print(b.malloc, "|", sorted(faults[2:])[2])
"""


def _run(env: dict[str, str]) -> tuple[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    clean.pop("POLYTRAIN_NUMPY_MALLOC", None)
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
def test_a_numpy_training_step_reuses_freed_memory() -> None:
    state, faults = _run({})
    system_state, system_faults = _run({"POLYTRAIN_NUMPY_MALLOC": "system"})
    assert state == "reuse"
    assert system_state == "system: POLYTRAIN_NUMPY_MALLOC=system"
    # measured: ~12,000 faults per step with glibc's defaults, a few with reuse
    assert system_faults > 2000, "the premise: glibc's defaults fault the step's pages in"
    assert faults < system_faults / 10


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_a_lower_trim_threshold_never_replaces_a_higher_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from polytrain.utils import malloc

    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(malloc, "_trim_set", 0)
    assert malloc.keep_freed_memory("POLYTRAIN_X_MALLOC", 128 << 20) == "reuse"
    assert malloc.keep_freed_memory("POLYTRAIN_Y_MALLOC", 64 << 20) == "reuse"
    assert malloc._trim_set == 128 << 20


def test_a_bad_numpy_mode_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from polytrain_numpy import _backend

    monkeypatch.setenv("POLYTRAIN_NUMPY_MALLOC", "jemalloc")
    with pytest.raises(BackendError, match="POLYTRAIN_NUMPY_MALLOC must be 'reuse' or 'system'"):
        _backend.NumpyBackend()
