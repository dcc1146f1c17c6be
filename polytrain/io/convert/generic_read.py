"""The map that reads a native file of a model that is none of the built-in ones: the
user's entries first, then the format's rule (its leaf renames undone, see
:class:`~polytrain.io.convert.rules.NameRule`); a 2-D tensor's layout from the map, from
the roles a companion file gives (a Paddle program's ops) or from what the file itself
records about its layer; and the notes saying what these rules did."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polytrain.backend.native_format import CompanionRoles, NativeFormat, TensorRole
from polytrain.errors import ConfigError
from polytrain.io import native as native_io
from polytrain.io.attention import pack_read
from polytrain.io.convert.rules import NameRule, PathLike, listed, transposed_kinds
from polytrain.io.name_map import MapEntry, NameMap, UserEntry, UserMap


def generic_read_map(
    fmt: str,
    tensors: Mapping[str, np.ndarray],
    path: PathLike,
    user: UserMap | None,
    notes: list[str],
) -> NameMap:
    """A map for a model that is none of the built-in ones: the user's entries first, then
    the generic rules (the format's leaf renames undone); where the format stores some
    layer kinds transposed, a 2-D tensor's layout comes from the map or from what the file
    itself records about its layer, else it stays undecided."""
    declared = native_io.get_format(fmt)
    rule = NameRule(declared.layout)
    companion = declared.companion_roles(path)
    evidence: Mapping[str, str] = {}
    if rule.transposing and companion is None:
        evidence = declared.layer_kinds(path) or {}
    user = user or UserMap({})
    names = _NativeNames(rule, user, companion.roles if companion is not None else {}, evidence)
    entries: dict[str, MapEntry] = {}
    for native, value in tensors.items():
        if native.endswith(rule.layout.ignored_suffixes):
            continue
        if native in names.packed:  # a part of a packed tensor the map lists
            name = names.packed[native]
            entries.setdefault(name, rule.exact_entry(name, user.exact[name]))
            continue
        canonical, entry = names.entry(native, np.ndim(value))
        if canonical in entries:
            raise ConfigError(
                f"{path}: {entries[canonical].native!r} and {native!r} would both be "
                f"{canonical!r}; give one of them another name in the map."
            )
        entries[canonical] = entry
    if rule.layout.attention:  # q/k/v Linears kept apart: packed as PyTorch packs them
        entries = pack_read(entries, tensors, rule.layout.attention, user, notes)
    for name, given in user.exact.items():  # named by the map, not in the file: missing
        entries.setdefault(name, rule.exact_entry(name, given))
    if companion is not None:
        notes.extend(_companion_notes(companion, entries))
    _generic_notes(fmt, declared, entries, user, names.matched, notes)
    ignore = rule.layout.ignored_suffixes
    return NameMap(fmt, entries, ignore=ignore, source=f"the generic {fmt} rules")


class _NativeNames:
    """The canonical name and map entry of each native tensor of a file: by the map's
    exact entries, then its prefix and re: entries, then the format's rule; the layer kind
    from the map, the companion file's roles or the file's own evidence."""

    def __init__(
        self,
        rule: NameRule,
        user: UserMap,
        roles: Mapping[str, TensorRole],
        evidence: Mapping[str, str],
    ) -> None:
        self.rule, self.user, self.roles, self.evidence = rule, user, roles, evidence
        exact = user.exact.items()
        self.by_native = {rule.exact_native(n, e): n for n, e in exact if not e.parts}
        self.packed = {part: name for name, e in exact for part in e.parts}
        self.matched: set[str] = set()  # the keys of the map's rules that matched a tensor

    def entry(self, native: str, ndim: int) -> tuple[str, MapEntry]:
        if native in self.by_native:
            canonical = self.by_native[native]
            given = self.user.exact[canonical]
        else:
            name, given = native, UserEntry()
            found = self.user.rule_for_native(native)
            if found is not None:
                (map_rule, name), given = found, UserEntry(kind=found[0].kind)
                self.matched.add(map_rule.key)
            canonical = self.rule.canonical_name(name, self.roles.get(native))
        role = self.roles.get(native)
        kind = given.kind or (role.kind if role is not None else self.evidence.get(native))
        transpose = given.transpose
        if transpose is None:
            transpose = self.rule.transpose(kind, canonical, ndim)
        return canonical, MapEntry(native, transpose, given.shape, kind, reshape=given.reshape)


def _companion_notes(companion: CompanionRoles, entries: Mapping[str, MapEntry]) -> list[str]:
    """What the file beside the weights established: the kinds found, the tensors named
    by their role, those it says nothing about."""
    notes = list(companion.notes)
    roles = companion.roles
    if not roles:
        return notes
    kinds: dict[str, int] = {}
    for role in roles.values():
        if role.kind is not None:
            kinds[role.kind] = kinds.get(role.kind, 0) + 1
    found = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"
    notes.append(
        f"layer kinds from {companion.source} (the op each tensor feeds), in tensors: {found}"
    )
    renamed = [
        f"{e.native} -> {name}"
        for name, e in entries.items()
        if e.native in roles and name.rpartition(".")[2] != e.native.rpartition(".")[2]
    ]
    if renamed:
        notes.append(f"named by their role in {companion.source}: {listed(renamed)}")
    unknown = [e.native for e in entries.values() if e.native not in roles]
    if unknown:
        notes.append(f"no op of {companion.source} establishes: {listed(unknown)}")
    return notes


def _generic_notes(
    fmt: str,
    declared: NativeFormat,
    entries: Mapping[str, MapEntry],
    user: UserMap,
    matched: set[str],
    notes: list[str],
) -> None:
    renames = declared.layout.canonical_leaves()
    rule = "as it is"
    if renames:  # say what was done, not what could have been
        renamed = [
            e.native
            for name, e in entries.items()
            if e.native != name and e.native.rpartition(".")[2] in renames
        ]
        rule = f"{'/'.join(renames)} -> {'/'.join(renames.values())}: " + (
            f"{len(renamed)} tensor(s) renamed"
            if renamed
            else f"none renamed, no name ends in {' or '.join('.' + r for r in renames)}"
        )
    notes.append(f"not a built-in model: generic {fmt} rules ({rule})")
    transposed = [n for e in entries.values() if e.transpose for n in e.natives]
    if transposed:  # the kinds these tensors are, else every kind the format transposes
        kinds = "/".join(sorted({e.kind for e in entries.values() if e.transpose and e.kind}))
        notes.append(
            f"transposed as {kinds or transposed_kinds(declared)} weights: {listed(transposed)}"
        )
    unused = [r.key for r in user.rules if r.key not in matched]
    if unused:
        notes.append(f"map entries that matched no tensor: {listed(unused)}")
