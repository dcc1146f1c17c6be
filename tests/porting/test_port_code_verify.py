"""``polytrain port-code SRC --verify FACTORY``: the model a converted file defines runs
against the original's through port's per-layer check (issue 36, item 4)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polytrain.cli.main import main
from polytrain.porting.code.verify import verify_converted

pytestmark = pytest.mark.runs_user_code  # the fixtures' factories set float64

E2E = Path(__file__).resolve().parents[1] / "fixtures" / "port_code" / "e2e"


@pytest.mark.slow
@pytest.mark.parametrize(("name", "framework"), [("paddle_cnn", "paddle"), ("gluon_cnn", "mxnet")])
def test_a_converted_file_verifies_layer_by_layer(
    name: str, framework: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip(framework)
    pytest.importorskip("torch")
    src = tmp_path / f"{name}.py"
    shutil.copy(E2E / src.name, src)
    out = tmp_path / f"{name}_torch.py"
    argv = ["port-code", str(src), "-o", str(out), "--verify", "build", "--input-shape", "2,1,8,8"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"{framework} -> torch" in printed and "verified: every layer within" in printed
    assert "conv2" in printed and "(output)" in printed


@pytest.mark.slow
def test_a_wrong_conversion_fails_verification_naming_the_layer(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    pytest.importorskip("torch")
    src = tmp_path / "paddle_cnn.py"
    shutil.copy(E2E / src.name, src)
    out = tmp_path / "paddle_cnn_torch.py"
    assert main(["port-code", str(src), "-o", str(out)]) == 0
    wrong = out.read_text().replace("x = F.relu(self.conv2(x))", "x = torch.tanh(self.conv2(x))")
    assert wrong != out.read_text(), "the converted file changed: update the edit"
    out.write_text(wrong)
    result = verify_converted(src, out, "SmallCNN", input_shape=(2, 1, 8, 8))
    assert not result.passed
    first = result.verification.first_failure
    assert first is not None and first.layer == "fc"  # the first layer after the tanh


@pytest.mark.slow
def test_a_folder_names_the_module_of_its_factory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("paddle")
    pytest.importorskip("torch")
    project = tmp_path / "proj" / "nets"
    project.mkdir(parents=True)
    (project / "__init__.py").write_text("")
    shutil.copy(E2E / "paddle_cnn.py", project / "cnn.py")
    out = tmp_path / "proj_torch"
    argv = ["port-code", str(tmp_path / "proj"), "-o", str(out), "--verify", "nets.cnn:SmallCNN",
            "--input-shape", "2,1,8,8"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr()
    assert "verified: every layer within" in capsys.readouterr().out
    assert main([*argv[:4], "--overwrite", "--verify", "SmallCNN", *argv[6:]]) == 2
    assert "for a folder, name pkg.module:FACTORY" in capsys.readouterr().err


def test_verify_needs_an_input_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "paddle_cnn.py"
    shutil.copy(E2E / src.name, src)
    assert main(["port-code", str(src), "--verify", "build"]) == 2
    assert "--verify needs --input-shape" in capsys.readouterr().err
    assert not (tmp_path / "paddle_cnn_torch.py").exists()
