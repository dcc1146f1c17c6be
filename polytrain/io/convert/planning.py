"""Which map a conversion uses for each side: the user's entries for that side (a map
with or without format keys), merged over the built-in map of a model spec; and the check
that every tensor's layout is decided before anything is converted."""

from __future__ import annotations

from collections.abc import Mapping

from polytrain.errors import CheckpointError, ConfigError
from polytrain.io import native as native_io
from polytrain.io.convert.rules import NameRule, listed, transposed_kinds
from polytrain.io.name_map import MapEntry, NameMap, UserEntry, UserMap, undecided_message
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import ModelSpec


def user_side(fw: str, user: dict[str | None, UserMap] | None, other: str) -> UserMap | None:
    """The user's entries for the ``fw`` side of a conversion whose other side is ``other``."""
    if user is None:
        return None
    if fw in user:
        return user[fw]
    if None in user and flat_map_side(fw, other):
        return user[None]
    if None in user and not is_canonical(fw):
        raise ConfigError(
            f"The map names no framework, and both sides ({fw} and {other}) need one: "
            f'write it as {{"{fw}": {{...}}, "{other}": {{...}}}}.'
        )
    return None


def merge_spec(base: NameMap, user: UserMap | None, spec: ModelSpec) -> NameMap:
    """The built-in map of ``spec`` with the user's entries over it."""
    if user is None:
        return base
    unknown = [n for n in user.exact if n not in base.entries]
    if unknown:
        raise ConfigError(f"The map names {listed(unknown)}, which model {spec.name!r} lacks.")
    rule = NameRule.of(base.framework)
    merged = {}
    for name, entry in base.entries.items():
        given = user.exact.get(name)
        if given is None:
            found = user.rule_for_canonical(entry.native)
            if found is None:
                merged[name] = entry
                continue
            given = UserEntry(found[1], None, found[0].kind)
        transpose = given.transpose
        if transpose is None:
            transpose = rule.transpose(given.kind, name, 0) if given.kind else entry.transpose
        merged[name] = MapEntry(
            given.native or entry.native,
            transpose,
            entry.shape,
            given.kind or entry.kind,
            given.parts or entry.parts,
        )
    source = f"model {spec.name!r} with the map"
    return NameMap(base.framework, merged, base.constants, base.ignore, source=source)


def is_canonical(fw: str) -> bool:
    """Neutral, or a format whose names and layout are the canonical ones."""
    return fw == NEUTRAL or native_io.get_format(fw).layout.canonical


def flat_map_side(fw: str, other: str) -> bool:
    """A map without format keys describes the non-canonical side (Paddle, MXNet);
    between canonical ones (PyTorch, neutral), the side that is a native file."""
    if not is_canonical(fw):
        return is_canonical(other) or other == fw
    return fw != NEUTRAL and is_canonical(other)


def check_decided(
    nmap: NameMap, what: str, evidence: str, shapes: Mapping[str, tuple[int, ...]]
) -> None:
    """CheckpointError naming the tensors whose layout neither the map nor ``evidence``
    decides (2-D tensors of unknown kind in a format that transposes some kind)."""
    if not nmap.undecided():
        return
    declared = native_io.get_format(nmap.framework)
    stores = (
        f"{declared.label} stores {transposed_kinds(declared)} weights transposed "
        f"({declared.layout.note}) and other 2-D tensors as they are"
    )
    raise CheckpointError(undecided_message(what, nmap, shapes, evidence, stores))
