"""The values of a checkpoint manifest, checked before anything uses them.

A manifest is JSON a user can edit or damage: a string where a number belongs, a key
missing, a negative step or a number past any real run. Each rule names what a key must
hold; :func:`check_fields` turns the first broken one into one :class:`CheckpointError`
line naming the file and the key (never a traceback from deep inside a reader).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from polytrain.errors import CheckpointError

MAX_COUNT = 2**53  # steps, epochs, samples: past this a float no longer counts exactly

Rule = tuple[Callable[[Any], bool], str]  # (accepts the value, what it must be)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


COUNT: Rule = (
    lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT,
    "a whole number in 0..2**53",
)
NUMBER: Rule = (_number, "a finite number")
RATE: Rule = (lambda v: _number(v) and v >= 0, "a finite number >= 0")
POSITIVE: Rule = (lambda v: _number(v) and v > 0, "a finite number > 0")
TEXT: Rule = (lambda v: isinstance(v, str), "a string")
NUMBERS: Rule = (lambda v: isinstance(v, list) and all(map(_number, v)), "a list of numbers")
NAMES: Rule = (
    lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
    "a list of names",
)


def optional(rule: Rule) -> Rule:
    """``rule``, or null."""
    ok, what = rule
    return (lambda v: v is None or ok(v), f"{what} or null")


def check_fields(
    file: Path, key: str, value: Any, rules: Mapping[str, Rule], required: tuple[str, ...] = ()
) -> None:
    """Raise :class:`CheckpointError` for the first of ``value``'s fields (``value`` is the
    manifest's ``key``) that is missing from ``required`` or breaks its rule."""
    if not isinstance(value, dict):
        raise _malformed(file, key, "an object", value)
    for name in required:
        if name not in value:
            raise CheckpointError(
                f"{file} is malformed: {key}.{name} is missing. The checkpoint was damaged "
                "or edited; use an earlier checkpoint."
            )
    for name, (ok, what) in rules.items():
        if name in value and not ok(value[name]):
            raise _malformed(file, f"{key}.{name}", what, value[name])


def check_each(file: Path, key: str, values: Any, check: Callable[[str, Any], None]) -> None:
    """``check(f"{key}[i]", item)`` for each item of the list ``values`` (null: none)."""
    for i, item in enumerate(values or []):
        check(f"{key}[{i}]", item)


def _malformed(file: Path, key: str, what: str, value: Any) -> CheckpointError:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return CheckpointError(
        f"{file} is malformed: {key} must be {what}, not {shown}. The checkpoint was damaged "
        "or edited; use an earlier checkpoint."
    )


# -- the manifest's own fields --------------------------------------------------------------------

OPTIMIZER = {"step": COUNT, "lr": RATE, "config": (lambda v: isinstance(v, dict), "an object")}
CONFIG = {"name": TEXT}
POSITION = {"epoch": COUNT, "step": COUNT, "global_step": COUNT}
SCALER = {
    "precision": TEXT,
    "scale": POSITIVE,
    "growth_factor": POSITIVE,
    "backoff_factor": POSITIVE,
    "growth_interval": COUNT,
    "good_steps": COUNT,
    "skipped": COUNT,
}
EPOCH = {  # an epoch record's fields that are never null; the others: numbers or null
    "epoch": COUNT,
    "steps": COUNT,
    "train_loss": NUMBER,
    "train_metric": NUMBER,
    "train_accuracy": NUMBER,  # train_metric's name in older checkpoints
    "metric": TEXT,
    "seconds": RATE,
    "samples_per_second": RATE,
}


def check_manifest(file: Path, manifest: Mapping[str, Any]) -> None:
    """Check the numbers of a manifest whose top-level types are already right."""
    check_fields(file, "position", manifest["position"], POSITION, tuple(POSITION))
    optimizer = manifest["optimizer"]
    if optimizer is not None:
        check_fields(file, "optimizer", optimizer, OPTIMIZER, ("config", "step", "lr"))
        check_fields(file, "optimizer.config", optimizer["config"], CONFIG)
        slots = {name: NAMES for name in optimizer["slots"]}
        check_fields(file, "optimizer.slots", optimizer["slots"], slots)
    if manifest.get("scaler") is not None:
        check_fields(file, "scaler", manifest["scaler"], SCALER, ("scale",))
    check_each(file, "history", manifest.get("history"), lambda k, v: _check_epoch(file, k, v))


def _check_epoch(file: Path, key: str, record: Any) -> None:
    numbers = {name: optional(NUMBER) for name in (record if isinstance(record, dict) else {})}
    check_fields(file, key, record, {**numbers, **EPOCH}, ("epoch",))
