"""Built-in recipes (``--recipe NAME``): the preset's fields, with written flags on top."""

from __future__ import annotations

from pathlib import Path

import pytest

from polytrain.cli.config_file import apply_config
from polytrain.cli.parser import build_parser
from polytrain.cli.recipe_args import explicit_options, recipe_from_args
from polytrain.errors import ConfigError
from polytrain.training.presets import PRESETS, preset_recipe
from polytrain.training.recipe import Recipe


def _recipe(*argv: str) -> Recipe:
    parser = build_parser()
    args = parser.parse_args(["train", *argv])
    args.explicit = explicit_options(list(argv), args.subparser)
    if args.config:
        args.explicit |= apply_config(args, args.subparser, args.config)
    return recipe_from_args(args)


def test_default_preset_is_the_default_recipe() -> None:
    assert preset_recipe("lenet-fashion-mnist") == Recipe()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name: str) -> None:
    recipe = preset_recipe(name)
    for key, value in PRESETS[name].items():
        assert getattr(recipe, key) == value


def test_written_flags_override_the_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PRESETS, "probe", {"lr": 0.123, "epochs": 7, "batch_size": 64})
    recipe = _recipe("--recipe", "probe", "--epochs", "3", "--layer-weight-decay", "fc1=0.5")
    assert (recipe.lr, recipe.epochs, recipe.batch_size) == (0.123, 3, 64)
    assert recipe.per_layer_weight_decay == {"fc1": 0.5}
    # a flag left at its default does not undo the preset
    assert _recipe("--recipe", "probe", "--lr", str(Recipe().lr)).epochs == 7


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="Built-in recipes: lenet-fashion-mnist"):
        _recipe("--recipe", "nope")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_ships_as_a_recipe_file(name: str) -> None:
    """examples/recipes/NAME.toml is the preset, field by field (regenerate it when a
    preset changes: polytrain recipe of a run of it, or the loop in examples/README.md)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "recipes" / f"{name}.toml"
    assert _recipe("--config", str(path)) == preset_recipe(name)
