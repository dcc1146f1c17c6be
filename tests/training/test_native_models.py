"""The user's own native model (a torch ``nn.Module``, a Paddle ``nn.Layer``, a Gluon
``Block``) in a run: ``Trainer(Recipe(model=module))`` and ``polytrain train --model
pkg.module:factory`` train it with its own weights, checkpoint its tensors by name, and
resume to the numbers of an uninterrupted run; what needs a ModelSpec is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from polytrain.cli.main import main
from polytrain.errors import ConfigError, DataError, PolytrainError
from polytrain.io.checkpoint import find_checkpoint, load_checkpoint
from polytrain.parity.compare import compare
from polytrain.plugins.registry import get_backend
from polytrain.testing.conformance import backends_under_test
from polytrain.testing.recorders import StepLosses
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

pytestmark = pytest.mark.runs_user_code  # the factories build (and seed) framework models
FRAMEWORKS = [name for name in ("torch", "paddle", "mxnet") if name in backends_under_test()]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "native_models"
MODULE = "tests_native_factories"
SMALL = dict(batch_size=16, optimizer="sgd", lr=0.1, precision="fp64")
FLAGS = ["--batch-size", "16", "--optimizer", "sgd", "--lr", "0.1", "--precision", "fp64"]


@pytest.fixture
def factories(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The module of native factories, importable as ``tests_native_factories``."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return __import__(MODULE)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    """48 training and 16 test samples of [4, 4] inputs in 3 classes."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "d.npz"
    np.savez(path, x_train=rng.standard_normal((48, 4, 4)), y_train=rng.integers(0, 3, 48),
             x_test=rng.standard_normal((16, 4, 4)), y_test=rng.integers(0, 3, 16))  # fmt: skip
    return str(path)


def fit(recipe: Recipe, backend: str, out: Path | None, resume: Path | None = None) -> list[float]:
    losses = StepLosses()
    Trainer(recipe, backend, out_dir=out, resume=resume, plugins=[losses], progress=False).fit()
    return losses.values


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_native_object_trains_checkpoints_and_resumes(
    framework: str, factories: ModuleType, data: str, tmp_path: Path
) -> None:
    make = getattr(factories, f"{framework}_mlp")
    whole = fit(Recipe(model=make(), data=data, epochs=2, **SMALL), framework, None)  # type: ignore[arg-type]
    model = make()
    first = fit(Recipe(model=model, data=data, epochs=1, **SMALL), framework, tmp_path)  # type: ignore[arg-type]
    saved = load_checkpoint(tmp_path)
    assert saved.manifest["model"]["spec"] is None and saved.recipe is not None
    assert saved.recipe["model"].startswith(f"native:{framework}:")
    assert any(name.endswith("weight") for name in saved.params)  # tensors by name
    rest = fit(Recipe(model=model, data=data, epochs=2, **SMALL), framework, tmp_path, tmp_path)  # type: ignore[arg-type]
    assert len(whole) == 6 and len(first) == len(rest) == 3
    np.testing.assert_allclose(first + rest, whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_module_keeps_its_own_initial_weights(
    framework: str, factories: ModuleType, data: str
) -> None:
    make = getattr(factories, f"{framework}_mlp")
    trainer = Trainer(Recipe(model=make(), data=data, **SMALL), framework, progress=False)  # type: ignore[arg-type]
    backend = get_backend(framework)
    own = backend.get_params(backend.build_model(make(), dtype="float64"))
    built = trainer.backend.get_params(trainer.model)
    assert sorted(built) == sorted(own)
    for name, value in own.items():
        np.testing.assert_array_equal(built[name], value)
    trainer.folder.release()


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_cli_trains_a_factory_and_resumes_by_calling_it_again(
    framework: str, factories: ModuleType, data: str, tmp_path: Path
) -> None:
    ref = f"{MODULE}:{framework}_mlp"
    base = ["train", "--backend", framework, "--data", data, *FLAGS, "--quiet"]
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert main([*base, "--model", ref, "--epochs", "2", "--out", str(whole)]) == 0
    assert main([*base, "--model", ref, "--epochs", "1", "--out", str(run)]) == 0
    resume = ["train", "--backend", framework, "--resume", str(run), "--out", str(run)]
    assert main([*resume, "--epochs", "2", "--quiet"]) == 0
    ends = [load_checkpoint(find_checkpoint(path)) for path in (whole, run)]
    assert ends[1].recipe is not None and ends[1].recipe["model"] == ref
    assert [len(end.history or []) for end in ends] == [2, 2]
    for name, value in ends[0].params.items():
        np.testing.assert_allclose(ends[1].params[name], value, rtol=0, atol=1e-12)


def test_a_factory_of_another_framework_is_one_line(
    factories: ModuleType, data: str, capsys: pytest.CaptureFixture[str]
) -> None:
    other = next(name for name in ("torch", "paddle", "mxnet") if name != FRAMEWORKS[0])
    argv = ["train", "--backend", FRAMEWORKS[0], "--model", f"{MODULE}:{other}_mlp"]
    assert main([*argv, "--data", data, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"is a {other} model" in err and f"trains {FRAMEWORKS[0]} models" in err


def test_a_native_model_on_a_spec_only_backend_is_one_line(
    factories: ModuleType, data: str
) -> None:
    recipe = Recipe(model=factories.torch_mlp(), data=data, **SMALL)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"is a torch model .*numpy backend trains numpy"):
        Trainer(recipe, "numpy", progress=False)


def test_anything_else_from_a_factory_is_one_line() -> None:
    recipe = Recipe(model="json:JSONDecoder", epochs=1)  # neither a spec nor a model
    with pytest.raises(ConfigError, match="gave a JSONDecoder, not a polytrain ModelSpec or a"):
        Trainer(recipe, "torch", progress=False)


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ({"fast": True}, "--fast compiles"),
        ({"inspect": "1"}, "--inspect reads"),
        ({"recipe": {"pipeline_split": 2}}, "--pipeline-split cuts"),
        ({"recipe": {"dropout_masks": "parity"}}, "--dropout-masks parity"),
    ],
)
def test_what_needs_a_spec_is_one_line(
    option: dict[str, Any], says: str, factories: ModuleType, data: str
) -> None:
    fields = {**SMALL, **option.pop("recipe", {})}
    recipe = Recipe(model=factories.torch_mlp(), data=data, **fields)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=f"{says}.*the model is a torch model"):
        Trainer(recipe, "torch", progress=False, **option)


def test_the_probe_forward_checks_outputs_against_classes(
    factories: ModuleType, data: str, tmp_path: Path
) -> None:
    path = tmp_path / "ten.npz"
    rng = np.random.default_rng(1)
    np.savez(path, x_train=rng.standard_normal((32, 4, 4)), y_train=np.arange(32) % 10)
    recipe = Recipe(model=factories.torch_five_outputs(), data=str(path), **SMALL)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"gives 5 outputs per sample, but .* has 10 classes"):
        Trainer(recipe, "torch", progress=False)
    np.savez(path, x_train=rng.standard_normal((32, 3, 3)), y_train=np.arange(32) % 3)
    recipe = Recipe(model=factories.torch_mlp(), data=str(path), **SMALL)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"probe forward of one batch of shape \[16, 3, 3\]"):
        Trainer(recipe, "torch", progress=False)


def test_compare_needs_a_spec(factories: ModuleType, data: str, tmp_path: Path) -> None:
    for model in (factories.torch_mlp(), f"{MODULE}:torch_mlp"):
        recipe = Recipe(model=model, data=data, epochs=1, **SMALL)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"needs a ModelSpec.*polytrain port"):
            compare(["numpy", "torch"], recipe, tmp_path / "cmp")
    argv = ["compare", "--backends", "numpy,torch", "--model", f"{MODULE}:torch_mlp"]
    assert main([*argv, "--data", data, "--out", str(tmp_path / "c"), "--quiet"]) == 2
    assert not (tmp_path / "c" / "numpy").exists()


def test_a_cli_resume_of_an_object_run_says_how(
    factories: ModuleType, data: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = Recipe(model=factories.torch_mlp(), data=data, epochs=1, **SMALL)  # type: ignore[arg-type]
    fit(recipe, "torch", tmp_path)
    argv = ["train", "--backend", "torch", "--resume", str(tmp_path), "--epochs", "2"]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "native object passed from Python" in err and len(err.strip().splitlines()) == 1
    manifest = json.loads((find_checkpoint(tmp_path) / "manifest.json").read_text())
    assert manifest["model"]["spec"] is None


def test_a_native_run_has_trackers_early_stopping_and_health_checks(
    factories: ModuleType, data: str, tmp_path: Path
) -> None:
    recipe = Recipe(model=factories.torch_mlp(), data=data, epochs=6, early_stop=1,  # type: ignore[arg-type]
                    val_split=0.25, **SMALL)  # fmt: skip
    summary = Trainer(recipe, "torch", out_dir=tmp_path, log="csv", progress=False).fit()
    assert summary.stop_reason.startswith("early stop"), summary.stop_reason
    assert len(summary.epochs) < 6 and all(e.val_accuracy is not None for e in summary.epochs)
    assert list(tmp_path.glob("*.csv")), sorted(p.name for p in tmp_path.iterdir())
    diverging = Recipe(model=factories.torch_mlp(), data=data, epochs=2, batch_size=16,  # type: ignore[arg-type]
                       optimizer="sgd", lr=1e6, precision="fp64")  # fmt: skip
    with pytest.raises(PolytrainError, match="global step"):
        Trainer(diverging, "torch", out_dir=tmp_path / "bad", progress=False).fit()
