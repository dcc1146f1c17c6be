"""The lockstep's cost (docs/performance.md, "The lockstep's cost"): the OpenMP pools of
the frameworks sharing its process sleep between their steps, and its seconds are
reported per backend."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from polytrain.parity.lockstep import quiet_openmp_pools
from polytrain.plugins.registry import get_backend
from polytrain.testing import backends_under_test

OPENMP = [name for name in backends_under_test() if name in ("torch", "paddle", "mxnet")]

SCRIPT = """
import json, os, sys
import numpy as np
from polytrain.data import ArrayDataset
from polytrain.parity.lockstep import lockstep
from polytrain.training.recipe import Recipe
rng = np.random.default_rng(0)
train = ArrayDataset(rng.standard_normal((8, 1, 28, 28)).astype("float32"),
                     rng.integers(0, 10, 8), num_classes=10)
done = lockstep(sys.argv[1:], Recipe(batch_size=4), 2, train=train).to_dict()
answer = {k: done[k] for k in ("omp_wait_policy", "seconds", "cpu_seconds")}
print(json.dumps({**answer, "environ": os.environ.get("OMP_WAIT_POLICY")}))
"""


@pytest.mark.slow
def test_lockstep_pools_wait_passively_and_report_seconds() -> None:
    """A process that runs the lockstep: every OpenMP framework starts its pool with
    ``OMP_WAIT_POLICY=PASSIVE`` (set before its import), and every backend's seconds,
    the reference's too, reach the result's JSON."""
    names = ["numpy", *OPENMP]
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    cmd = [sys.executable, "-c", SCRIPT, *names]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["omp_wait_policy"] == "PASSIVE" and answer["environ"] == "PASSIVE"
    for clock in ("seconds", "cpu_seconds"):
        assert sorted(answer[clock]) == sorted(names)
        assert all(seconds > 0 for seconds in answer[clock].values())


def test_a_users_wait_policy_is_kept_and_early_imports_named() -> None:
    """The user's ``OMP_WAIT_POLICY`` wins; a framework imported before the lockstep keeps
    the pool it started and the policy says so."""
    saved = os.environ.pop("OMP_WAIT_POLICY", None)
    try:
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
        assert quiet_openmp_pools(OPENMP) == "ACTIVE (the user's OMP_WAIT_POLICY)"
        assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
        del os.environ["OMP_WAIT_POLICY"]
        for name in OPENMP:
            get_backend(name)  # imports the framework
        early = [name for name in OPENMP if name in sys.modules]
        expected = f"PASSIVE, except {', '.join(early)} (imported before)" if early else "PASSIVE"
        assert quiet_openmp_pools(OPENMP) == expected
    finally:
        os.environ.pop("OMP_WAIT_POLICY", None)
        if saved is not None:
            os.environ["OMP_WAIT_POLICY"] = saved


@pytest.mark.slow
def test_lockstep_cost_benchmark_runs() -> None:
    """``python -m benchmarks.lockstep_cost`` prints own and lockstep ms per step per
    backend (numpy alone: no framework to import)."""
    from benchmarks.run import ROOT

    argv = ["--backends", "numpy", "--steps", "1", "--warmup", "1", "--batch-size", "8"]
    cmd = [sys.executable, "-m", "benchmarks.lockstep_cost", *argv, "--before"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for clock in ("wall", "cpu "):
        assert f"{clock} backend        own  lockstep  ratio    before  ratio" in proc.stdout
    assert re.search(r"numpy +\d+\.\d +\d+\.\d +\d+\.\d\d +\d+\.\d +\d+\.\d\d", proc.stdout)
