"""scripts/gpu-check on a machine without a CUDA device: every part says so, exit 0; it
runs from the source tree alone (no installed polytrain); and the conformance suite's
device hook (POLYTRAIN_TEST_DEVICE) moves models and tensors to the device named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from polytrain import get_backend
from polytrain.neutral.models import get_model_spec
from polytrain.testing.placement import device_under_test, on_test_device

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check"

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")


def run_check(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [str(SCRIPT), "--out", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(out.read_text()) if out.is_file() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.mark.slow
def test_every_part_reports_no_cuda_device_and_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    code, report, output = run_check(tmp_path, env)
    assert code == 0, output
    parts = report["parts"]
    assert [p["number"] for p in parts] == list(range(1, 9))
    for part in parts:
        assert part["status"] == "skip", part
        assert part["summary"].startswith("no CUDA device"), part
    assert "no CUDA device" in output
    # --require-gpu makes the missing device an error, with its own exit status
    code, _, output = run_check(tmp_path, env, "--require-gpu", "--parts", "1")
    assert code == 3, output
    assert "no CUDA device" in output


@pytest.mark.slow
def test_runs_from_the_source_tree_without_an_installed_polytrain(tmp_path: Path) -> None:
    """A clean environment, and an interpreter that reads no site-packages .pth files
    (``-S``: this venv's editable install of polytrain is gone); the frameworks come from
    PYTHONPATH, polytrain and its torch backend only from the tree the script adds."""
    site = sysconfig.get_paths()["purelib"]
    env = {"PATH": "/usr/bin:/bin", "PYTHON": f"{sys.executable} -S", "PYTHONPATH": site}
    code, report, output = run_check(tmp_path, env, "--parts", "2,8")
    assert code == 0, output
    environment = report["environment"]
    assert environment["site_packages_read"] is False
    assert environment["polytrain_from"] == str(ROOT / "polytrain")
    assert [p["status"] for p in report["parts"]] == ["skip", "skip"]


def test_bad_parts_are_refused_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    code, _, output = run_check(tmp_path, env, "--parts", "1,9")
    assert code == 2
    assert "--parts '1,9': the parts are 1 to 8" in output


def test_conformance_device_hook_places_models_and_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """POLYTRAIN_TEST_DEVICE moves what the suite puts on the CPU (no device, ``cpu``,
    ``cpu:K``) to the device named (here the emulated cpu:1, as gpu:0 on a GPU)."""
    monkeypatch.setenv("POLYTRAIN_TEST_DEVICE", "cpu:1")
    assert device_under_test() == "cpu:1"
    backend = on_test_device(get_backend("torch"))
    assert backend.name == "torch"
    spec = get_model_spec("lenet")
    for devices in (None, backend.devices("cpu:2")):
        model = backend.build_model(spec, devices)
        names = [backend.device_name(d) for d in model.devices]
        assert names == ["cpu:1"] * (1 if devices is None else 2)
    monkeypatch.delenv("POLYTRAIN_TEST_DEVICE")
    plain = get_backend("torch")
    assert on_test_device(plain) is plain
    model = plain.build_model(spec, plain.devices("cpu:2"))
    assert [plain.device_name(d) for d in model.devices] == ["cpu:0", "cpu:1"]
