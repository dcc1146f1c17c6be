"""Which named tensors are missing, unexpected or of the wrong shape: one comparison and one
wording for every place that checks parameters against a model (backends' ``set_params``,
checkpoints, conversions)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytrain.errors import CheckpointError

Shape = tuple[int, ...]


def name_list(names: Iterable[str], limit: int | None = None) -> str:
    """``a, b, c``; past ``limit`` names, ``a, b, ... and 3 more``."""
    items = list(names)
    if limit is None or len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", ... and {len(items) - limit} more"


@dataclass(frozen=True)
class WrongShape:
    name: str
    expected: Shape
    found: Shape

    def __str__(self) -> str:
        return f"{self.name} {self.found} (expected {self.expected})"


@dataclass(frozen=True)
class Mismatch:
    """How the names (and shapes) found differ from those expected; false when they agree."""

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    wrong_shape: tuple[WrongShape, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.wrong_shape)

    def parts(self, limit: int | None = None) -> list[str]:
        """``missing ...``, ``unexpected ...``, ``wrong shape ...``: those that apply."""
        wrong = [str(w) for w in self.wrong_shape]
        return [
            f"{label} {name_list(items, limit)}"
            for label, items in (
                ("missing", self.missing),
                ("unexpected", self.unexpected),
                ("wrong shape", wrong),
            )
            if items
        ]

    def describe(self, limit: int | None = None) -> str:
        """One line: the :meth:`parts` joined by ``; `` (empty when nothing differs)."""
        return "; ".join(self.parts(limit))

    def check(self, what: str, limit: int | None = None) -> None:
        """Nothing when the names and shapes agree, else ``CheckpointError("{what}: ...")``."""
        if self:
            raise CheckpointError(f"{what}: {self.describe(limit)}.")


def compare_names(expected: Iterable[str], found: Iterable[str]) -> Mismatch:
    """Names expected but not found, and found but not expected, each in its own order."""
    want, have = list(expected), list(found)
    want_set, have_set = set(want), set(have)
    return Mismatch(
        missing=tuple(n for n in want if n not in have_set),
        unexpected=tuple(n for n in have if n not in want_set),
    )


def compare_shapes(expected: Mapping[str, Shape], found: Mapping[str, Shape]) -> Mismatch:
    """:func:`compare_names`, plus the names found in both whose shapes differ."""
    names = compare_names(expected, found)
    wrong = tuple(
        WrongShape(n, tuple(expected[n]), tuple(found[n]))
        for n in expected
        if n in found and tuple(expected[n]) != tuple(found[n])
    )
    return Mismatch(names.missing, names.unexpected, wrong)


def check_params(
    expected: Mapping[str, Any],
    given: Mapping[str, np.ndarray],
    shape_of: Callable[[Any], Shape],
) -> None:
    """A CheckpointError naming the missing, unexpected and misshapen entries of
    ``given`` against a model's ``expected`` entries (whose shapes ``shape_of`` reads)."""
    compare_shapes(
        {k: tuple(shape_of(v)) for k, v in expected.items()},
        {k: tuple(np.shape(v)) for k, v in given.items()},
    ).check("Parameters do not match the model")
