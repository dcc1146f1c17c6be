"""``Recipe(model=...)`` from Python takes a :class:`ModelSpec` object or a path, not only
the strings ``--model`` takes: a run of a spec object checkpoints it, resumes without it,
and compares it across backends; anything else is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polytrain.errors import ConfigError
from polytrain.io.checkpoint import load_checkpoint
from polytrain.neutral.models import Flatten, Linear, ModelSpec, ReLU, Sequential
from polytrain.neutral.spec_file import spec_to_file
from polytrain.parity.compare import compare
from polytrain.testing.conformance import backends_under_test
from polytrain.testing.recorders import StepLosses
from polytrain.training.recipe import Recipe
from polytrain.training.trainer import Trainer

BACKENDS = backends_under_test()
SMALL = dict(train_samples=48, test_samples=16, batch_size=16, optimizer="sgd", lr=0.1,
             precision="fp64")  # fmt: skip


def mlp() -> ModelSpec:
    net = Sequential((("flat", Flatten()), ("fc1", Linear(784, 16)), ("act", ReLU()),
                      ("fc2", Linear(16, 10))))  # fmt: skip
    return ModelSpec("my-mlp", net, (1, 28, 28), 10)


def fit(recipe: Recipe, backend: str, out: Path | None, resume: Path | None = None) -> list[float]:
    losses = StepLosses()
    Trainer(recipe, backend, out_dir=out, resume=resume, plugins=[losses], progress=False).fit()
    return losses.values


@pytest.mark.slow
def test_a_spec_object_trains_checkpoints_and_resumes(backend_name: str, tmp_path: Path) -> None:
    whole = fit(Recipe(model=mlp(), epochs=2, **SMALL), backend_name, None)  # type: ignore[arg-type]
    first = fit(Recipe(model=mlp(), epochs=1, **SMALL), backend_name, tmp_path)  # type: ignore[arg-type]
    saved = load_checkpoint(tmp_path)
    assert saved.recipe is not None and saved.recipe["model"]["name"] == "my-mlp"
    # resumed from the checkpoint's own recipe: the spec comes back from its dict
    again = Recipe.from_dict({**saved.recipe, "epochs": 2})
    assert again.model == mlp()
    rest = fit(again, backend_name, tmp_path, resume=tmp_path)
    assert len(whole) == 6 and whole[-1] < whole[0]  # it trained
    np.testing.assert_allclose(first + rest, whole, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_a_path_object_names_a_spec_file(tmp_path: Path) -> None:
    path = spec_to_file(mlp(), tmp_path / "mlp.json")
    recipe = Recipe(model=path, epochs=1, **SMALL)  # type: ignore[arg-type]
    assert recipe.model == str(path) and recipe.model_name == str(path)
    assert fit(recipe, BACKENDS[0], None) == fit(
        Recipe(model=mlp(), epochs=1, **SMALL),
        BACKENDS[0],
        None,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("model", [7, None, "", ["lenet"]])
def test_anything_else_is_one_line(model: object) -> None:
    with pytest.raises(ConfigError, match="--model takes a built-in name, pkg"):
        Recipe(model=model)  # type: ignore[arg-type]


@pytest.mark.slow
def test_compare_runs_a_spec_object_on_each_backend(tmp_path: Path) -> None:
    """Each backend's run is a process: the spec goes to them as ``model.json``."""
    names = ["numpy", BACKENDS[0] if BACKENDS[0] != "numpy" else BACKENDS[1]]
    recipe = Recipe(model=mlp(), epochs=1, **SMALL)  # type: ignore[arg-type]
    result = compare(names, recipe, tmp_path, quiet=True, lockstep_steps=2)
    assert json.loads((tmp_path / "model.json").read_text())["name"] == "my-mlp"
    assert all(len(run.step_losses) == 3 for run in result.runs) and result.ok, result.failures
