"""Recipe files: ``polytrain train --config recipe.toml`` (and ``compare``).

A TOML file of ``key = value`` lines, one key per command-line option of the command, named
as the option without its dashes (``batch_size = 128`` for ``--batch-size 128``), plus the
recipe's own names where they differ (``per_layer_weight_decay = {fc1 = 0.01}``; ``loss`` and
``metric`` may be tables: ``loss = {name = "cross_entropy", label_smoothing = 0.1}``; a
repeatable option takes a list: ``plugin = ["pkg.mod:Class"]``). Flags
written on the command line override the file; the file overrides ``--recipe``'s preset
(``recipe = "NAME"`` in the file names one) and the defaults. An unknown key, a value of the
wrong type or out of range is one line naming the key and its line in the file.

Read with the standard library's ``tomllib``; ``polytrain recipe RUN_DIR`` writes such a
file with ``tomli-w`` (a small, maintained writer: the standard library only reads TOML).
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError
from polytrain.utils.user_files import TEXT_LIMIT, read_text

# recipe fields whose command-line option is spelled otherwise
FIELD_OPTIONS = {"per_layer_weight_decay": "layer_weight_decay"}
NOT_IN_FILES = {"help", "config", "resume"}  # --resume names a run, not a setting


def load_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """The file's keys and values, and its text (for line numbers)."""
    text = read_text(path, "--config", TEXT_LIMIT)  # a binary file or a FIFO: one line
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML: {exc}.") from None


def line_of(text: str, key: str) -> str:
    """``line N`` of ``key = ...`` in ``text`` ('' if not found)."""
    pattern = re.compile(rf"^[ \t]*{re.escape(key)}[ \t]*=", re.M)
    match = pattern.search(text)
    return f"line {text.count(chr(10), 0, match.start()) + 1}" if match else "line ?"


def apply_config(
    args: argparse.Namespace, parser: argparse.ArgumentParser, path: str | Path
) -> set[str]:
    """Set ``args`` from the file where the command line did not; returns the option
    destinations the file gave (they count as written, for ``--recipe`` and ``--resume``)."""
    values, text = load_config(path)
    actions = {
        a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_IN_FILES
    }
    given = set()
    for key, value in values.items():
        dest = FIELD_OPTIONS.get(key, key)
        where = f"--config {path}, {line_of(text, key)}: {key}"
        action = actions.get(dest)
        if action is None:
            known = ", ".join(sorted(actions))
            raise ConfigError(f"{where}: unknown key; keys of this command: {known}.")
        converted = option_value(action, key, value, where)
        given.add(dest)
        if dest not in args.explicit:  # the command line wins
            setattr(args, dest, converted)
    return given


def option_value(action: argparse.Action, key: str, value: Any, where: str) -> Any:
    """``value`` checked as the option would check its text; one line naming the key."""
    if key == "per_layer_weight_decay":
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a table, e.g. {{fc1 = 0.01}}.")
        return ",".join(f"{name}={decay}" for name, decay in value.items())
    if key in ("loss", "metric") and isinstance(value, dict):
        return value
    if key == "log" and isinstance(value, list):  # log = ["csv", "mlflow"]
        return ",".join(_typed(item, str, where) for item in value)
    if isinstance(action, argparse._AppendAction):  # plugin = ["pkg.mod:Class", ...]
        items = value if isinstance(value, list) else [value]
        return [_typed(item, str, where) for item in items]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return _typed(value, bool, where)
    if isinstance(action, argparse.BooleanOptionalAction):
        return _typed(value, bool, where)
    kind = action.type
    if kind is int or (kind is None and isinstance(action.default, int)):
        value = _typed(value, int, where)
    elif kind is float:
        value = float(_typed(value, (int, float), where))
    elif kind is None or kind is str:
        value = _typed(value, str, where)
    elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{where}: expected a number or a string, got {value!r}.")
    if callable(kind) and kind not in (int, float, str):
        try:
            value = kind(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(
            f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}."
        )
    return value


def _typed(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    names = {bool: "true or false", int: "an integer", str: "a string"}
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        want = names.get(kind, "a number") if isinstance(kind, type) else "a number"
        raise ConfigError(f"{where}: expected {want}, got {value!r}.")
    return value


def recipe_toml(recipe: dict[str, Any]) -> str:
    """A recipe (``Recipe.to_dict()``) as a recipe file: every field that has a value."""
    import tomli_w

    values = {k: v for k, v in recipe.items() if v is not None and v != {}}
    return tomli_w.dumps(values)
