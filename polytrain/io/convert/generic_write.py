"""The map that writes canonical weights of a model that is none of the built-in ones:
names as they are but for the leaves the format renames for a layer kind (a
normalisation layer's, recognised by its running statistics), by the same
:class:`~polytrain.io.convert.rules.NameRule` that reads them; a 2-D tensor's layout from
the map or the layer kinds read with the weights; attention tensors split as the format's
Linears store them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polytrain.errors import ConfigError
from polytrain.io.attention import unpack_write
from polytrain.io.convert.rules import NameRule, listed
from polytrain.io.name_map import MapEntry, NameMap, UserEntry, UserMap
from polytrain.neutral.models import BatchNorm2d

NORM = BatchNorm2d.__name__  # the layer kind the generic rules recognise (running stats)


def generic_write_map(
    to: str, params: Mapping[str, np.ndarray], user: UserMap | None, kinds: Mapping[str, str]
) -> NameMap:
    """Names as they are (a normalisation layer's leaves renamed as the format names them);
    where the format stores some layer kinds transposed, a 2-D tensor's layout comes from
    the map or the layer kinds read with the weights, else it stays undecided."""
    rule = NameRule.of(to)
    layout = rule.layout
    user = user or UserMap({})
    unknown = [n for n in user.exact if n not in params]
    if unknown:
        raise ConfigError(f"The map names {listed(unknown)}, which the weights lack.")
    split, split_kinds, split_notes = (
        unpack_write(params, layout.attention, user) if layout.attention else ({}, {}, [])
    )
    entries = {}
    for name, value in params.items():
        if name in split:  # an attention tensor, as the format's Linears store it
            entries[name] = _split_entry(split[name], split_kinds[name], rule, user)
        elif user.exact.get(name, UserEntry()).parts:
            entries[name] = rule.exact_entry(name, user.exact[name])
        else:
            entries[name] = _native_entry(name, np.ndim(value), rule, user, params, kinds)
    natives = [n for e in entries.values() for n in e.natives]
    dupes = sorted({n for n in natives if natives.count(n) > 1})
    if dupes:
        raise ConfigError(f"Several tensors would be written as {listed(dupes)}: fix the map.")
    constants = {  # what the format adds to each normalisation layer (torch's counter)
        f"{entry.native.rpartition('.')[0]}.{leaf}": value
        for name, entry in entries.items()
        if name.endswith(".running_mean")
        for leaf, value in layout.constants.get(NORM, {}).items()
    }
    return NameMap(to, entries, constants, source=f"the generic {to} rules", notes=split_notes)


def _native_entry(
    name: str,
    ndim: int,
    rule: NameRule,
    user: UserMap,
    params: Mapping[str, np.ndarray],
    kinds: Mapping[str, str],
) -> MapEntry:
    """The entry writing the canonical tensor ``name``: the map's exact entry, else the
    format's rule (a normalisation layer's leaves renamed) then the map's prefix and re:
    entries; the layout by the kind the map or the source file gives."""
    given = user.exact.get(name, UserEntry())
    kind, native = given.kind, given.native
    if native is None:
        norm = NORM if kind is None and _looks_like_norm(name, params) else None
        native = rule.native_name(name, kind or norm)
        found = user.rule_for_canonical(native) if name not in user.exact else None
        if found is not None:
            native, kind = found[1], kind or found[0].kind
    kind = kind or kinds.get(name)  # what the source file said, for the layout
    transpose = given.transpose
    if transpose is None:
        transpose = rule.transpose(kind, name, ndim)
    return MapEntry(native, transpose, given.shape, kind, reshape=given.reshape)


def _split_entry(parts: tuple[str, ...], kind: str, rule: NameRule, user: UserMap) -> MapEntry:
    """The entry writing one attention tensor as the parts ``parts`` (Linear weights or
    biases), each renamed by the user's prefix or re: entries."""
    renamed = []
    for part in parts:
        found = user.rule_for_canonical(part)
        renamed.append(found[1] if found is not None else part)
    transpose = rule.transpose(kind, parts[0], 0)
    return MapEntry(renamed[0], transpose, None, kind, tuple(renamed) if len(parts) > 1 else ())


def _looks_like_norm(name: str, params: Mapping[str, np.ndarray]) -> bool:
    """weight/bias of a normalisation layer (it has running statistics beside them)."""
    head = name.rpartition(".")[0]
    return f"{head}.running_mean" in params
