"""The data-parallel examples run on every backend, on a small slice of Fashion-MNIST.

Each backend gets one subprocess that runs the three examples in turn (their
``__main__`` through runpy), so a framework is imported once per backend; the
backends' subprocesses run side by side with one thread each. Each example's output
and exit status is then checked by its own test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polytrain.testing import backends_under_test

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SLICE = ["--epochs", "1", "--test-samples", "64"]
RUNS = {
    "d2l_scratch_data_parallel": [
        *SLICE,
        *("--devices", "cpu:2", "--train-samples", "256", "--batch-size", "64"),
    ],
    "d2l_concise_data_parallel": [
        *SLICE,
        *("--devices", "cpu:3", "--model", "lenet", "--train-samples", "256"),
        *("--batch-size", "64", "--quiet"),
    ],
    "pytorch_dataparallel_tutorial": [
        *SLICE,
        *("--devices", "cpu:2", "--train-samples", "16", "--batch-size", "4"),
    ],
}
DRIVER = """
import runpy, sys, traceback
backend, out, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
for run in runs:
    name, *args = run.split()
    if name == "pytorch_dataparallel_tutorial":
        args += ["--out", f"{out}/{name}"]
    sys.argv = [name, "--backend", backend, *args]
    print(f"=== begin {name}", flush=True)
    try:
        runpy.run_path(f"{EXAMPLES}/{name}.py", run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        code = 1
    print(f"=== end {name} status {code}", flush=True)
"""
TIMEOUT = 300


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every backend's driver output, all started at once."""
    env = {**os.environ, "POLYTRAIN_THREADS": "1"}
    runs = [" ".join([name, *args]) for name, args in RUNS.items()]
    procs = {}
    for name in backends_under_test():
        out = tmp_path_factory.mktemp(name)
        code = DRIVER.replace("{EXAMPLES}", str(EXAMPLES))
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", code, name, str(out), *runs],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    results = {}
    for name, proc in procs.items():
        try:
            results[name], _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            results[name] = proc.communicate()[0] + f"\n(killed after {TIMEOUT} s)"
    return results


def section(outputs: dict[str, str], backend: str, example: str) -> str:
    """One example's output; fails with the whole log unless it exited with status 0."""
    log = outputs[backend]
    found = re.search(rf"=== begin {example}\n(.*?)=== end {example} status (-?\d+)", log, re.S)
    assert found, f"{example} did not finish on {backend}:\n{log}"
    text, status = found.group(1), int(found.group(2))
    assert status == 0, f"{example} failed on {backend} (status {status}):\n{text}"
    return text


@pytest.mark.slow
def test_scratch_example(outputs: dict[str, str], backend_name: str) -> None:
    text = section(outputs, backend_name, "d2l_scratch_data_parallel")
    assert re.search(
        rf"epoch 1: train loss [\d.]+, test acc [\d.]+, .* on cpu:0,cpu:1 \({backend_name}\)", text
    )


@pytest.mark.slow
def test_concise_example(outputs: dict[str, str], backend_name: str) -> None:
    text = section(outputs, backend_name, "d2l_concise_data_parallel")
    assert "lenet on cpu:0,cpu:1,cpu:2, global batch 64 = 22 per device" in text
    assert re.search(r"epoch 1: train loss [\d.]+, test acc [\d.]+", text)


@pytest.mark.slow
def test_dataparallel_tutorial_example(outputs: dict[str, str], backend_name: str) -> None:
    text = section(outputs, backend_name, "pytorch_dataparallel_tutorial")
    assert re.search(r"Train Accuracy is:[\d.]+%, Test Accuracy is:[\d.]+", text)
    accuracies = re.findall(r"state dict reloaded on cpu: test accuracy ([\d.]+)", text)
    assert len(accuracies) == 2, text  # native and neutral files, on one device
