"""A user's code and files fail as one line naming them; nothing is silently ignored
(issue 42, items 6 and 7). Each case runs the real CLI in this process on the numpy backend
(decided before any framework does work) and checks the one line, the exit status 2 and
that no run was started."""

from __future__ import annotations

import io
import json
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.cli.main import main
from polytrain.neutral.models import Dropout, Flatten, Linear, ModelSpec, seq

TINY = ["--backend", "numpy", "--train-samples", "64", "--test-samples", "32",
        "--batch-size", "32", "--epochs", "1", "--quiet"]  # fmt: skip
FACTORIES = """
from polytrain.neutral.models import Flatten, Linear, ModelSpec, seq
def raises():
    raise RuntimeError("boom in the factory")
def needs(width):
    return width
def seven():
    return ModelSpec("seven", seq(("f", Flatten()), ("fc", Linear(784, 7))), num_classes=10)
"""


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test's folder as the working directory and on sys.path (user modules)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("POLYTRAIN_DEBUG", raising=False)
    (tmp_path / "user_factories.py").write_text(FACTORIES)
    (tmp_path / "user_syntax.py").write_text("def f(:\n")
    (tmp_path / "user_importerror.py").write_text("raise ImportError('a missing dependency')\n")
    yield tmp_path
    for name in ("user_factories", "user_syntax", "user_importerror"):
        sys.modules.pop(name, None)


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``polytrain ARGV``; assert exit 2 and one error line; return that line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("polytrain ")]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def train_refused(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> str:
    line = refused(capsys, "train", *TINY, "--out", str(out), *extra)
    assert not (out / "metrics.jsonl").exists(), "a run started"
    return line


# -- user code ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("user_factories:raises", "calling raises() failed: RuntimeError: boom in the factory"),
        ("user_factories:needs", "needs cannot be called with no arguments"),
        ("user_syntax:f", "importing 'user_syntax' failed: SyntaxError"),
        ("user_importerror:f", "importing 'user_importerror' failed: a missing dependency"),
    ],
)
def test_a_failing_model_factory_is_one_line_naming_it(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], ref: str, expected: str
) -> None:
    line = train_refused(capsys, in_tmp / "run", "--model", ref)
    assert f"--model {ref!r}" in line and expected in line, line


def test_debug_shows_the_users_traceback(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", *TINY, "--out", str(in_tmp / "run"), "--model",
                 "user_factories:raises", "--debug"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" in err and 'raise RuntimeError("boom in the factory")' in err, err
    assert err.strip().splitlines()[-1].startswith("polytrain train: error: --model"), err


@pytest.mark.slow
def test_a_model_whose_outputs_are_not_its_classes_is_refused(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = train_refused(capsys, in_tmp / "run", "--model", "user_factories:seven")
    assert "gives 7 outputs per sample but its num_classes is 10" in line, line


# -- model specs ----------------------------------------------------------------------------


def spec_file(folder: Path, name: str, layer: dict[str, Any]) -> Path:
    net = [{"name": "flat", "type": "Flatten"}, layer]
    if layer["type"] != "Linear":
        net.append({"name": "fc", "type": "Linear", "in_features": 784, "out_features": 10})
    data = {"name": "hostile", "input_shape": [1, 28, 28], "num_classes": 10, "net": net}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def linear(out: Any, inp: Any = 784) -> dict[str, Any]:
    return {"name": "fc", "type": "Linear", "in_features": inp, "out_features": out}


@pytest.mark.parametrize(
    ("layer", "expected"),
    [
        (linear(10, 784.0), "layer 'fc' (Linear): in_features must be an integer in 1.."),
        (linear(10, "784"), "in_features must be an integer in 1..2147483647, got '784'"),
        (linear(-10), "out_features must be an integer in 1..2147483647, got -10"),
        (linear(0), "out_features must be an integer in 1..2147483647, got 0"),
        (linear(10**12), "got 1000000000000"),
        (linear(10**9), "785,000,000,000 parameters"),
        ({"name": "drop", "type": "Dropout", "p": 2.0}, "p must be a number in [0, 1)"),
        ({"name": "drop", "type": "Dropout", "p": float("nan")}, "got nan"),
        ({"name": "drop", "type": "Dropout", "p": True}, "got True"),
    ],
)
def test_a_spec_with_bad_values_is_one_line_naming_the_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layer: dict[str, Any], expected: str
) -> None:
    path = spec_file(tmp_path, "spec", layer)
    line = train_refused(capsys, tmp_path / "run", "--model", str(path))
    assert expected in line, line


@pytest.mark.parametrize("depth", [70, 100_000])
def test_a_spec_nested_too_deeply_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    leaf = json.dumps({"type": "Linear", "in_features": 784, "out_features": 10})
    net = '{"type": "Sequential", "layers": [["s", ' * depth + leaf + "]]}" * depth
    path = tmp_path / "deep.json"
    path.write_text(f'{{"name": "deep", "input_shape": [784], "num_classes": 10, "net": {net}}}')
    line = train_refused(capsys, tmp_path / "run", "--model", str(path))
    assert "too deeply" in line or "levels deep" in line, line


def test_python_built_specs_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"layer 'drop' \(Dropout\): p must be a number in"):
        ModelSpec("m", seq(("flat", Flatten()), ("drop", Dropout(1.5)), ("fc", Linear(784, 10))))


# -- data, recipe files ---------------------------------------------------------------------


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def lying_npz(path: Path) -> None:
    """An .npz whose y_train header claims 1e15 rows (the member holds 64)."""
    member = io.BytesIO()
    np.lib.format.write_array(member, np.arange(64) % 10)
    raw = member.getvalue().replace(b"'shape': (64,)", b"'shape': (1000000000000000,)")
    x = io.BytesIO()
    np.lib.format.write_array(x, np.zeros((64, 1, 28, 28), np.float32))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x_train.npy", x.getvalue())
        archive.writestr("y_train.npy", raw)


@pytest.mark.parametrize("case", ["truncated", "npy", "huge_header", "objects", "device"])
def test_a_bad_data_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    x, y = np.zeros((64, 1, 28, 28), np.float32), np.arange(64) % 10
    path = tmp_path / "data.npz"
    if case == "truncated":
        data = npz_bytes(x_train=x, y_train=y)
        path.write_bytes(data[: len(data) // 2])
    elif case == "npy":
        path = tmp_path / "data.npy"
        np.save(path, x)
    elif case == "huge_header":
        lying_npz(path)
    elif case == "objects":
        np.savez(path, x_train=x, y_train=np.array([{"a": 1}] * 64, dtype=object))
    else:
        path = Path("/dev/zero")
    expected = {
        "truncated": "not a whole .npz (zip) file",
        "npy": "is a single .npy array",
        "huge_header": "claims shape (1000000000000000,)",
        "objects": "holds Python objects",
        "device": "not a regular file",
    }[case]
    line = train_refused(capsys, tmp_path / "run", "--model", "lenet", "--data", str(path))
    assert expected in line, line


@pytest.mark.parametrize("case", ["latin1", "device", "folder"])
def test_a_recipe_file_that_is_not_text_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path = {"latin1": tmp_path / "r.toml", "device": Path("/dev/zero"), "folder": tmp_path}[case]
    if case == "latin1":
        path.write_bytes(b'epochs = 1\nmodel = "caf\xe9"\n')
    line = train_refused(capsys, tmp_path / "run", "--config", str(path))
    expected = {"latin1": "is not UTF-8 text (byte 0xe9 on line 2", "device": "not a regular file",
                "folder": "is a folder"}[case]  # fmt: skip
    assert expected in line, line


# -- nothing silently ignored ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--layer-weight-decay", "nosuchlayer=0.1"], "names 'nosuchlayer', which is no layer"),
        (["--batch-size", "100000"], "--batch-size 100000 is larger than the 64 training"),
        (["--devices", ""], "--devices '' names no device"),
    ],
)
def test_options_that_match_nothing_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], expected: str
) -> None:
    line = train_refused(capsys, tmp_path / "run", *extra)
    assert expected in line, line


def test_labels_of_one_column_for_a_classifier_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "data.npz"
    np.savez(
        path, x_train=np.zeros((64, 1, 28, 28), np.float32), y_train=(np.arange(64) % 10)[:, None]
    )
    line = train_refused(capsys, tmp_path / "run", "--data", str(path))
    assert "labels have shape [64, 1], but the model predicts [N, 10]" in line, line
    assert "y.reshape(-1)" in line


def test_compare_refuses_an_unknown_backend_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.monotonic()
    line = refused(
        capsys, "compare", "--backends", "numpy,tensorflow", "--out", str(tmp_path / "c")
    )
    assert "Unknown backend 'tensorflow'" in line, line
    assert time.monotonic() - start < 10
    assert not (tmp_path / "c" / "numpy").exists(), "the numpy run started"


def test_doctor_of_an_unknown_backend_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "doctor", "nosuch", "--no-collectives")
    assert "Unknown backend 'nosuch'" in line, line
