"""Recipe files (--config): keys, precedence, one-line errors, and the round trip through
``polytrain recipe`` with the same per-step losses."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from polytrain.cli.config_file import FIELD_OPTIONS
from polytrain.cli.main import main
from polytrain.cli.parser import build_parser
from polytrain.cli.recipe_args import explicit_options, recipe_from_args
from polytrain.errors import ConfigError
from polytrain.training.recipe import Recipe


def _recipe(*argv: str) -> Recipe:
    from polytrain.cli.config_file import apply_config

    parser = build_parser()
    args = parser.parse_args(["train", *argv])
    args.explicit = explicit_options(list(argv), args.subparser)
    if args.config:
        args.explicit |= apply_config(args, args.subparser, args.config)
    return recipe_from_args(args)


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return str(path)


def test_every_recipe_field_has_a_key() -> None:
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    dests = {a.dest for a in train._actions}
    missing = [f.name for f in fields(Recipe) if FIELD_OPTIONS.get(f.name, f.name) not in dests]
    assert not missing


def test_the_file_sets_the_recipe_and_flags_override_it(tmp_path: Path) -> None:
    config = _file(
        tmp_path,
        'optimizer = "sgd"\nlr = 0.1\nbatch_size = 64\nepochs = 3\ndrop_last = true\n'
        "per_layer_weight_decay = {fc1 = 0.01}\n"
        'loss = {name = "cross_entropy", label_smoothing = 0.1}\n',
    )
    recipe = _recipe("--config", config, "--epochs", "5")
    assert (recipe.optimizer, recipe.lr, recipe.batch_size, recipe.drop_last) == (
        "sgd", 0.1, 64, True
    )  # fmt: skip
    assert recipe.epochs == 5  # the command line wins
    assert recipe.per_layer_weight_decay == {"fc1": 0.01}
    assert recipe.loss_spec().label_smoothing == 0.1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lr = 0.1\nbatch_szie = 64\n", r"line 2: batch_szie: unknown key"),
        ("epochs = 2.5\n", r"line 1: epochs: expected an integer, got 2.5"),
        ('lr = "fast"\n', r"line 1: lr: expected a number"),
        ("drop_last = 1\n", r"line 1: drop_last: expected true or false"),
        ("\n\nthreads = 0\n", r"line 3: threads: .*1"),
        ('dropout_masks = "numpy"\n', r"line 1: dropout_masks: 'numpy' is not one of"),
        ("lr = [0.1\n", r"not valid TOML"),
    ],
)
def test_bad_files_are_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        _recipe("--config", _file(tmp_path, text))
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_run_reproduces_from_its_recipe_file(tmp_path: Path) -> None:
    """train with flags; polytrain recipe writes its file; train --config: the same losses."""
    slice_ = ["--backend", "numpy", "--train-samples", "96", "--test-samples", "32",
              "--batch-size", "32", "--epochs", "1", "--quiet"]  # fmt: skip
    first, second = tmp_path / "first", tmp_path / "second"
    flags = ["--optimizer", "sgd", "--lr", "0.07", "--momentum", "0.5", "--seed", "3",
             "--clip-grad-norm", "1.5", "--schedule", "cosine"]  # fmt: skip
    assert main(["train", *slice_, *flags, "--out", str(first)]) == 0
    config = tmp_path / "run.toml"
    assert main(["recipe", str(first), "-o", str(config)]) == 0
    assert 'optimizer = "sgd"' in config.read_text() and "lr = 0.07" in config.read_text()
    assert main(["train", "--config", str(config), "--backend", "numpy", "--quiet",
                 "--out", str(second)]) == 0  # fmt: skip

    def losses(run: Path) -> list[float]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["event"] == "step"]

    assert losses(first) == losses(second) and len(losses(first)) == 3
