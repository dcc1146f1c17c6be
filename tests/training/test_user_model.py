"""The user's own model, data and loss: ``polytrain train --model pkg.module:factory --data
file.npz`` on every backend, spec files, ``Trainer(datasets=...)``, and a user spec through
a neutral checkpoint and ``polytrain convert`` into each native format."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.cli.main import main
from polytrain.errors import ConfigError, DataError
from polytrain.io.checkpoint import find_checkpoint, load_checkpoint
from polytrain.neutral import reference
from polytrain.neutral.models import ModelSpec, mlp
from polytrain.neutral.spec_file import (
    resolve_model_spec,
    spec_from_dict,
    spec_from_file,
    spec_to_dict,
    spec_to_file,
)
from polytrain.plugins.registry import get_backend, registered_formats
from polytrain.testing.conformance import backends_under_test
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

HELPER = textwrap.dedent(
    """
    from polytrain import ModelSpec
    from polytrain.layers import Flatten, Linear, ReLU, seq

    def factory():
        return ModelSpec(
            "tiny-user-net",
            seq(("flatten", Flatten()), ("fc1", Linear(16, 8)), ("relu", ReLU()),
                ("fc2", Linear(8, 3))),
            input_shape=(1, 4, 4),
            num_classes=3,
            init="torch_default",
        )

    def regressor():
        return ModelSpec("tiny-regressor", seq(("fc", Linear(5, 2))), input_shape=(5,),
                         num_classes=2)

    not_a_spec = 42
    """
)
TOML_SPEC = """
name = "toml-net"
input_shape = [1, 4, 4]
num_classes = 3
init = "xavier_uniform"
net = [
  { name = "flatten", type = "Flatten" },
  { name = "fc1", type = "Linear", in_features = 16, out_features = 8 },
  { name = "relu", type = "ReLU" },
  { name = "fc2", type = "Linear", in_features = 8, out_features = 3 },
]
"""
TRAIN = ["--epochs", "1", "--batch-size", "8", "--lr", "0.1", "--optimizer", "sgd", "--quiet"]


@pytest.fixture
def helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's module, importable as ``tests_helper_module``."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "tests_helper_module.py").write_text(HELPER, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "tests_helper_module", raising=False)
    return folder


def _data(path: Path, n_train: int = 40, n_test: int = 10, **extra: np.ndarray | None) -> Path:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray | None] = {
        "x_train": rng.standard_normal((n_train, 4, 4)).astype(np.float32),
        "y_train": rng.integers(0, 3, n_train),
        "x_test": rng.standard_normal((n_test, 4, 4)).astype(np.float32),
        "y_test": rng.integers(0, 3, n_test),
    }
    arrays.update(extra)
    kept: dict[str, np.ndarray] = {k: v for k, v in arrays.items() if v is not None}
    np.savez(path, **kept)
    return path


@pytest.mark.slow
def test_train_a_user_factory_on_npz_data(
    backend_name: str, helper: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(tmp_path / "d.npz")
    out = tmp_path / "run"
    argv = ["train", "--backend", backend_name, "--model", "tests_helper_module:factory"]
    argv += ["--data", str(data), "--out", str(out), "--json", *TRAIN]
    argv += ["--loss", '{"name": "cross_entropy", "label_smoothing": 0.1}']
    argv += ["--metric", '{"name": "top_k", "k": 2}']
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    epoch = summary["epochs"][0]
    assert np.isfinite(epoch["train_loss"]) and 0 <= epoch["test_metric"] <= 1
    ck = load_checkpoint(find_checkpoint(out))
    assert ck.manifest["model"]["spec"]["name"] == "tiny-user-net"
    assert ck.recipe is not None and ck.recipe["data"] == str(data)


def test_the_console_script_finds_the_factory_on_pythonpath(helper: Path, tmp_path: Path) -> None:
    data = _data(tmp_path / "d.npz")
    cmd = [sys.executable, "-m", "polytrain", "train", "--backend", "numpy", "--model"]
    cmd += ["tests_helper_module:factory", "--data", str(data), *TRAIN]
    env = {"PYTHONPATH": str(helper), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "tests_helper_module:factory on" in done.stdout


def test_resume_and_convert_need_neither_the_factory_nor_the_file(
    helper: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, out = _data(tmp_path / "d.npz"), tmp_path / "run"
    base = ["train", "--backend", "numpy", "--data", str(data), "--out", str(out), *TRAIN]
    assert main([*base, "--model", "tests_helper_module:factory"]) == 0
    monkeypatch.delitem(sys.modules, "tests_helper_module")
    (helper / "tests_helper_module.py").unlink()  # the factory is gone
    resume = ["train", "--backend", "numpy", "--resume", str(out), "--out", str(out)]
    assert main([*resume, "--epochs", "2", "--quiet"]) == 0
    assert len(load_checkpoint(find_checkpoint(out)).history or []) == 2
    assert main(["convert", str(out), str(tmp_path / "n"), "--to", "neutral"]) == 0


def _native_formats() -> list[str]:
    installed = set(backends_under_test())
    return [name for name in registered_formats() if name in installed]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", _native_formats())
def test_a_user_spec_converts_to_each_native_format_and_evaluates_the_same(
    fmt: str, tmp_path: Path
) -> None:
    spec_file = tmp_path / "net.toml"
    spec_file.write_text(TOML_SPEC, encoding="utf-8")
    data, out = _data(tmp_path / "d.npz"), tmp_path / "run"
    argv = ["train", "--backend", "numpy", "--model", str(spec_file), "--data", str(data)]
    assert main([*argv, "--out", str(out), *TRAIN]) == 0
    ck = load_checkpoint(find_checkpoint(out))
    spec = ModelSpec.from_dict(ck.manifest["model"]["spec"])
    target = tmp_path / f"net{registered_formats()[fmt].suffix}"
    assert main(["convert", str(out), str(target), "--to", fmt]) == 0
    x = np.random.default_rng(5).standard_normal((6, 1, 4, 4)).astype(np.float32)
    want = reference.forward(spec, ck.params, x)
    backend = get_backend(fmt)
    model = backend.build_model(spec)
    backend.load_native(model, str(target))
    got = backend.to_numpy(backend.forward(model, backend.to_tensor(x)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    back = tmp_path / "back"  # and back into a neutral checkpoint, named by the spec file
    assert (
        main(["convert", str(target), str(back), "--to", "neutral", "--model", str(spec_file)]) == 0
    )
    params = load_checkpoint(find_checkpoint(back)).params
    for name, value in ck.params.items():
        np.testing.assert_allclose(params[name], value, rtol=1e-6, err_msg=name)


def test_spec_files_round_trip(tmp_path: Path) -> None:
    toml = tmp_path / "net.toml"
    toml.write_text(TOML_SPEC, encoding="utf-8")
    spec = spec_from_file(toml)
    assert spec.parameter_shapes()["fc1.weight"] == (8, 16)
    assert spec_from_dict(spec_to_dict(spec)) == spec
    assert spec_from_file(spec_to_file(spec, tmp_path / "net.json")) == spec
    assert resolve_model_spec(str(toml)) == spec
    assert resolve_model_spec("mlp").name == "mlp"


def test_spec_mistakes_are_one_line(helper: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ninput_shape = [4]\nnum_classes = 2\nnet = [{type = "ReLU"}]\n')
    with pytest.raises(ConfigError, match="has no 'name'"):
        spec_from_file(bad)
    bad.write_text('name="x"\ninput_shape=[4]\nnum_classes=2\nnet=[{name="a", type="Lin"}]\n')
    with pytest.raises(ConfigError, match="Unknown layer type 'Lin'"):
        spec_from_file(bad)
    bad.write_text('name="x"\ninput_shape=[4]\nnum_classes=2\nnet=[{name="a", type="Linear"}]\n')
    with pytest.raises(ConfigError, match=r"Layer Linear: .*in_features"):
        spec_from_file(bad)
    with pytest.raises(ConfigError, match="gave a int, not a polytrain ModelSpec"):
        resolve_model_spec("tests_helper_module:not_a_spec")
    with pytest.raises(ConfigError, match="has no 'nope'"):
        resolve_model_spec("tests_helper_module:nope")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module_xyz'"):
        resolve_model_spec("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match=r"Unknown model 'lenett'.*pkg\.module:factory"):
        resolve_model_spec("lenett")


def test_npz_data_is_checked_against_the_model_in_one_line(helper: Path, tmp_path: Path) -> None:
    recipe = dict(model="tests_helper_module:factory", epochs=1, batch_size=8)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"y_train": None}, DataError, "has no y_train"),
        ({"y_test": None}, DataError, "has no y_test"),
        ({"x_train": np.zeros((40, 5, 4), np.float32)}, DataError, r"takes \[N, 1, 4, 4\]"),
        ({"x_train": np.zeros((40, 4, 4), np.int32)}, DataError, "must be float or uint8"),
        ({"y_train": np.zeros(39, np.int64)}, DataError, "40 inputs but 39 targets"),
        ({"y_train": np.full(40, 3)}, DataError, "labels range over 3..3, but the model has 3"),
        ({"y_train": np.zeros(40, np.float32)}, DataError, "needs integer class labels"),
        ({"x_val": np.zeros((4, 4, 4))}, DataError, r"unknown arrays \['x_val'\]"),
    ]
    for i, (change, error, message) in enumerate(cases):
        data = _data(tmp_path / f"d{i}.npz", **change)
        with pytest.raises(error, match=message):
            Trainer(Recipe(**recipe, data=str(data)), "numpy", progress=False)  # type: ignore[arg-type]


class Samples:
    """An indexable object with a length (a torch-style Dataset, without torch)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if i >= len(self.x):
            raise IndexError(i)
        return self.x[i], self.y[i]


def test_trainer_takes_arrays_and_indexables_with_a_regression_loss(helper: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 5)).astype(np.float32)
    y = (x @ rng.standard_normal((5, 2))).astype(np.float32)
    recipe = Recipe(model="tests_helper_module:regressor", loss="mse", metric="mse", epochs=3,
                    batch_size=8, optimizer="sgd", lr=0.1)  # fmt: skip
    arrays = {"train": (x, y), "test": (x, y)}
    items = {"train": Samples(x, y), "test": Samples(x, y)}
    by_arrays = Trainer(recipe, "numpy", progress=False, datasets=arrays)
    by_items = Trainer(recipe, "numpy", progress=False, datasets=items)
    a, b = by_arrays.fit(), by_items.fit()
    assert [e.train_loss for e in a.epochs] == [e.train_loss for e in b.epochs]
    assert a.epochs[-1].train_loss < a.epochs[0].train_loss
    assert a.epochs[-1].test_metric == pytest.approx(a.epochs[-1].test_metric)  # the mse
    with pytest.raises(DataError, match="5 inputs but 4 targets"):
        Trainer(recipe, "numpy", progress=False, datasets=(x[:5], y[:4]))
    with pytest.raises(DataError, match=r"needs float targets \[N, 2\]"):
        Trainer(recipe, "numpy", progress=False, datasets=(x, y[:, 0]))
    with pytest.raises(DataError, match=r"takes \[N, 5\]"):
        Trainer(recipe, "numpy", progress=False, datasets=Samples(x[:, :4], y))


def test_every_layer_type_is_in_the_public_layer_module() -> None:
    import polytrain.layers
    from polytrain.neutral.models import LAYER_TYPES

    missing = [name for name in LAYER_TYPES if name not in polytrain.layers.__all__]
    assert not missing, f"polytrain.layers lacks {missing}"


def test_the_init_rule_has_a_neutral_name_and_reads_its_old_one(tmp_path: Path) -> None:
    """``fan_in_uniform`` is PyTorch's Conv/Linear default; a spec or file that says
    ``torch_default`` (its name before) still loads, as the same rule."""
    new = ModelSpec("fan-in", mlp().net, init="fan_in_uniform")
    old = ModelSpec.from_dict({**new.to_dict(), "init": "torch_default"})
    assert old.init == "fan_in_uniform" and old.to_dict() == new.to_dict()
    for name, value in new.init_params(seed=3).items():
        np.testing.assert_array_equal(old.init_params(seed=3)[name], value)
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**new.to_dict(), "init": "torch_default"}))
    assert spec_from_file(path).init == "fan_in_uniform"
    bias = new.init_params()["fc1.bias"]  # U(+-1/sqrt(fan_in)), weights and biases alike
    assert 0 < np.abs(bias).max() <= 1 / np.sqrt(784)
