"""Checks of a model spec's values before anything is built or allocated.

A spec comes from a user's file or factory, so each layer field is checked against its
annotation and a rule for its name (sizes are integers >= 1, dropout's ``p`` in [0, 1),
``eps`` > 0, axes non-zero integers, flags booleans), the nesting depth is bounded, and the
parameter count is compared with this machine's memory before a weight is drawn. Each
failure is one ConfigError naming the layer, the field, the value and the rule.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from polytrain.errors import ConfigError

MAX_DEPTH = 64  # nested Sequential/Residual/Add levels: far above any real network
MAX_SIZE = 2**31 - 1  # one dimension: the frameworks index with int32 in places
BYTES_PER_PARAMETER = 4  # float32 weights, the least a run holds on the host


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _size(value: Any) -> str:
    ok = _is_int(value) and 1 <= value <= MAX_SIZE
    return "" if ok else f"an integer in 1..{MAX_SIZE}"


def _count(value: Any) -> str:
    return "" if _is_int(value) and 0 <= value <= MAX_SIZE else f"an integer in 0..{MAX_SIZE}"


def _axis(value: Any) -> str:
    return "" if _is_int(value) and value != 0 and abs(value) <= 8 else "a non-zero axis in -8..8"


def _probability(value: Any) -> str:
    ok = _is_real(value) and 0.0 <= value < 1.0
    return "" if ok else "a number in [0, 1) (the probability of dropping a value)"


def _fraction(value: Any) -> str:
    return "" if _is_real(value) and 0.0 <= value <= 1.0 else "a number in [0, 1]"


def _positive(value: Any) -> str:
    ok = _is_real(value) and math.isfinite(value) and value > 0
    return "" if ok else "a finite number > 0"


def _flag(value: Any) -> str:
    return "" if isinstance(value, bool) else "true or false"


def _sizes(value: Any) -> str:
    items = (value,) if _is_int(value) else value
    ok = isinstance(items, list | tuple) and len(items) >= 1 and all(not _size(n) for n in items)
    return "" if ok else f"a list of integers in 1..{MAX_SIZE}"


def _shape(value: Any) -> str:
    ok = isinstance(value, list | tuple) and len(value) >= 1
    ok = ok and all(not _size(n) or n == -1 for n in value) and list(value).count(-1) <= 1
    return "" if ok else "a list of sizes >= 1 (one of them may be -1)"


Rule = Callable[[Any], str]
RULES: dict[str, Rule] = {
    "padding": _count,
    "p": _probability,
    "eps": _positive,
    "momentum": _fraction,
    "dim": _axis,
    "dim0": _axis,
    "dim1": _axis,
    "normalized_shape": _sizes,
    "shape": _shape,
}


def _rule(cls: type, name: str) -> Rule | None:
    """The rule of field ``name`` of ``cls``: by name, else by its annotation."""
    if name in RULES:
        return RULES[name]
    hint = typing.get_type_hints(cls).get(name)
    if hint is int:
        return _size
    if hint is bool:
        return _flag
    if hint == int | None:
        return lambda value: "" if value is None else _size(value)
    return None  # strings and nested layers: checked by the layer itself


def check_fields(cls: type, fields: Mapping[str, Any], where: str) -> None:
    """Each of ``fields`` (as given, before the layer is built) against its rule."""
    if not dataclasses.is_dataclass(cls):
        return
    known = {f.name for f in dataclasses.fields(cls)}
    for name, value in fields.items():
        rule = _rule(cls, name) if name in known else None
        wanted = rule(value) if rule else ""
        if wanted:
            raise ConfigError(f"{where} ({cls.__name__}): {name} must be {wanted}, got {value!r}.")


def _children(layer: Any) -> Iterator[tuple[str, Any]]:
    """The named children of a container layer (Sequential, Residual, Add) by its fields,
    so this module needs no import of the layer classes."""
    kind = type(layer).__name__
    if kind == "Sequential":
        yield from layer.layers
    elif kind == "Residual":
        yield "body", layer.body
        if layer.shortcut is not None:
            yield "shortcut", layer.shortcut
    elif kind == "Add":
        yield from ((f"branches.{i}", b) for i, b in enumerate(layer.branches))


def check_tree(net: Any, spec_name: str) -> None:
    """Every layer of ``net`` (depth first, without recursion) against its rules, and
    the nesting no deeper than :data:`MAX_DEPTH`."""
    stack: list[tuple[str, Any, int]] = [("", net, 0)]
    while stack:
        path, layer, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"Model spec {spec_name!r} nests layers more than {MAX_DEPTH} levels deep "
                f"(at {path!r}); flatten it into fewer Sequential levels."
            )
        children = list(_children(layer))
        if children or not dataclasses.is_dataclass(layer):
            stack.extend((f"{path}.{n}" if path else n, c, depth + 1) for n, c in children)
            continue
        values = {f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)}
        check_fields(type(layer), values, f"layer {path!r}")


def check_memory(spec_name: str, parameters: int) -> None:
    """Refuse a spec whose float32 weights alone exceed this machine's memory."""
    need = parameters * BYTES_PER_PARAMETER
    have = physical_memory()
    if have and need > have:
        raise ConfigError(
            f"Model spec {spec_name!r} has {parameters:,} parameters: {need / 2**30:,.1f} GiB "
            f"in float32 before gradients and optimizer state, more than this machine's "
            f"{have / 2**30:,.1f} GiB of memory. Check its layer sizes."
        )


def physical_memory() -> int:
    """Bytes of memory on this machine (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
