"""polytrain doctor reports, and its claims match what training actually does."""

from __future__ import annotations

import json
import re

import pytest

from polytrain.cli.doctor import PRECISIONS, run_doctor
from polytrain.cli.main import main
from polytrain.errors import PolytrainError
from polytrain.testing import backends_under_test
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:  # type: ignore[type-arg]
    return {r["backend"]: r for r in run_doctor(backends_under_test(), collectives=False)}


@pytest.mark.slow
def test_doctor_reports_every_backend(reports) -> None:  # type: ignore[no-untyped-def]
    for name in backends_under_test():
        r = reports[name]
        assert r["importable"], r
        assert r["version"] and r["threads"] and r["devices"]
        assert set(r["precisions"]) == set(PRECISIONS)
        assert r["precisions"]["fp32"]["ok"]
        for verdict in r["precisions"].values():
            assert verdict["ok"] or verdict["why"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_precision_claims_match_training(reports, precision: str) -> None:  # type: ignore[no-untyped-def]
    for name in backends_under_test():
        claimed = reports[name]["precisions"][precision]["ok"]
        recipe = Recipe(train_samples=64, test_samples=32, batch_size=32, epochs=1,
                        precision=precision)  # fmt: skip
        try:
            Trainer(recipe, name, progress=False).fit()
            works = True
        except PolytrainError:
            works = False
        assert works == claimed, f"{name} {precision}: doctor says {claimed}, training {works}"


@pytest.mark.slow
def test_doctor_collective_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "torch", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["collective"]["ok"], report["collective"]
    assert report["collective"]["engine"].startswith("torch.distributed")


def test_unknown_backend_is_reported_not_crashed() -> None:
    (report,) = run_doctor(["nope"], collectives=False)
    assert report["importable"] is False
    assert "Unknown backend 'nope'" in report["error"]


def test_doctor_says_what_it_probes_while_it_works(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "numpy", "--no-collectives"]) == 0
    err = capsys.readouterr().err
    assert "doctor [1/1] numpy: imports, devices, threads, precisions ..." in err
    assert re.search(r"doctor \[1/1\] numpy: done \(\d+ s\)", err)


def test_install_hints_keep_their_brackets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """rich would read ``[paddle]`` in ``polytrain[paddle]`` as a style tag and drop it."""
    import polytrain.cli.doctor as doctor

    hint = "Install it with: pip install 'polytrain[paddle]'"
    report = {"backend": "paddle", "importable": False, "error": hint}
    monkeypatch.setattr(doctor, "run_doctor", lambda *a, **k: [report])
    assert main(["doctor", "paddle", "--no-collectives"]) == 0
    assert f"why not: paddle: {hint}" in capsys.readouterr().out
