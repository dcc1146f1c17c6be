"""Name maps: which native tensor holds each canonical (PyTorch) one, and its layout.

A :class:`NameMap` is complete and resolved: one :class:`MapEntry` per canonical tensor.
A user's map (:func:`load_map`, the JSON of ``--map``) may be partial; it is merged over
the built-in or generic rules by :mod:`polytrain.io.convert`. Its entries are

* exact: ``"fc.weight": {"native": "head.w", "transpose": true, "shape": [10, 784]}``,
  ``"fc.bias": "head.b"`` (short for ``{"native": ...}``), or only a layout for a tensor
  whose name is already right: ``"fc.weight": {"kind": "Linear"}`` or
  ``{"transpose": false}``; a packed tensor lists the native tensors whose rows it joins
  (equal parts, each stored transposed when ``transpose`` says so):
  ``"attn.in_proj_weight": {"native": ["attn.q_proj.weight", "attn.k_proj.weight",
  "attn.v_proj.weight"], "transpose": true}``; ``reshape`` gives the canonical shape
  where it is another view of the stored one's (``shape``): a 1x1 convolution's weight
  [out, in, 1, 1] as a Linear's [out, in] (``polytrain port`` pairs the two), undone when
  writing: ``{"native": "head.weight", "shape": [10, 16, 1, 1], "reshape": [10, 16]}``;
* prefix (the key ends with ``.``): ``"features.": {"native": "backbone."}`` renames every
  name starting with ``features.``;
* regex (the key starts with ``re:``): ``"re:layer(\\d+)\\.(\\d+)\\.": {"native":
  "stage\\1.block\\2."}``, matched at the start of the canonical name, the rest of the name
  kept. It must read both ways: outside its ``(groups)`` only literal text (``\\.`` for a
  dot) and a final ``$``; each group used once in ``native``. A group of plain
  alternatives may be translated: ``"re:^layer(1|2)\\.": "features.\\1(4|5)."`` writes
  ``layer2.`` as ``features.5.`` (the n-th alternative becomes the n-th of the list).

Prefix and regex entries may give a ``kind`` (``Linear``, ...) for the layers they match.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_names, compare_shapes, name_list
from polytrain.backend.native_format import LAYER_KINDS, PathLike
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io import native as native_io
from polytrain.utils.user_files import read_json

UNVERIFIED = "unverified"  # set by polytrain port when verification failed

LIST_MAX = 6
REGEX = "re:"


# -- resolved maps -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapEntry:
    """Where one canonical tensor lives in a native file. ``transpose`` None: not known
    (a map with such an entry converts nothing; ``--print-map`` shows it as null)."""

    native: str
    transpose: bool | None = False
    shape: tuple[int, ...] | None = None  # canonical shape, checked when given
    kind: str | None = None  # the layer kind, where known (carried to the other side)
    parts: tuple[str, ...] = ()
    """a packed tensor (``in_proj_weight``): the native tensors whose canonical rows it
    joins, in equal parts and in order; ``native`` is the first"""
    reshape: tuple[int, ...] | None = None
    """the canonical shape where it is another view of the stored tensor's (``shape``):
    a 1x1 convolution's weight [out, in, 1, 1] read as a Linear's [out, in]"""

    @property
    def natives(self) -> tuple[str, ...]:
        return self.parts or (self.native,)

    def native_shape(self, canonical: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of each native tensor (of each part of a packed one)."""
        if self.parts and canonical:
            canonical = (canonical[0] // len(self.parts), *canonical[1:])
        return tuple(reversed(canonical)) if self.transpose else tuple(canonical)

    def split(self, value: np.ndarray) -> dict[str, np.ndarray]:
        """native name -> native tensor, from the canonical ``value``."""
        if self.reshape is not None and self.shape is not None:
            value = np.reshape(value, self.shape)
        pieces = np.split(value, len(self.parts)) if self.parts else [value]
        return {
            name: np.ascontiguousarray(piece.T if self.transpose else piece)
            for name, piece in zip(self.natives, pieces, strict=True)
        }

    def join(self, tensors: Mapping[str, np.ndarray], what: str) -> np.ndarray:
        """The canonical tensor from the native ones (the parts of a packed one joined)."""
        pieces = [np.asarray(tensors[n]) for n in self.natives]
        pieces = [piece.T if self.transpose else piece for piece in pieces]
        if len({piece.shape for piece in pieces}) > 1:
            shapes = ", ".join(f"{n} {list(np.shape(tensors[n]))}" for n in self.natives)
            raise CheckpointError(f"{what}: the parts of a packed tensor differ: {shapes}.")
        value = np.concatenate(pieces) if self.parts else pieces[0]
        if self.reshape is not None:
            value = _reshaped(value, self.reshape, what)
        return np.ascontiguousarray(value)


@dataclass
class NameMap:
    """canonical name -> :class:`MapEntry` for one format (``framework``: its name), in
    model order.

    ``constants`` are native-only entries written as they are (PyTorch's
    num_batches_tracked); native names ending in ``ignore`` are skipped when reading."""

    framework: str
    entries: dict[str, MapEntry]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    ignore: tuple[str, ...] = ()
    source: str = "built-in"
    notes: list[str] = field(default_factory=list)  # what writing with it changes, for the user

    def undecided(self) -> list[str]:
        """Canonical names whose layout is not known."""
        return [name for name, e in self.entries.items() if e.transpose is None]

    def to_native(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Native tensors from canonical ones (every entry of the map must be given)."""
        compare_names(self.entries, params).check(
            f"the weights does not match {self.source}", LIST_MAX
        )
        out: dict[str, np.ndarray] = {}
        for name, entry in self.entries.items():
            out.update(entry.split(np.asarray(params[name])))
        out.update(self.constants)
        return out

    def to_canonical(self, tensors: Mapping[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
        """Canonical tensors from native ones; missing, unexpected or misshapen entries are
        one CheckpointError naming them in the file's own terms."""
        present = [k for k in tensors if not (self.ignore and k.endswith(self.ignore))]
        expected = [n for e in self.entries.values() for n in e.natives]
        compare_names(expected, present).check(f"{what} does not match {self.source}", LIST_MAX)
        want = {
            n: e.native_shape(e.shape)
            for e in self.entries.values()
            if e.shape is not None
            for n in e.natives
        }
        wrong = compare_shapes(want, {n: tuple(np.shape(tensors[n])) for n in want})
        if wrong:
            note = native_io.get_format(self.framework).layout.note
            wrong.check(f"{what} does not fit {self.source} ({note})", LIST_MAX)
        return {name: entry.join(tensors, what) for name, entry in self.entries.items()}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of this map (the format of ``--map``)."""
        return {
            name: {"native": list(e.parts) if e.parts else e.native, "transpose": e.transpose}
            | ({"shape": list(e.shape)} if e.shape is not None else {})
            | ({"reshape": list(e.reshape)} if e.reshape is not None else {})
            for name, e in self.entries.items()
        }


# -- user maps -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class UserEntry:
    """An exact entry of a user's map; None: as the rules say."""

    native: str | None = None
    transpose: bool | None = None
    kind: str | None = None
    shape: tuple[int, ...] | None = None
    parts: tuple[str, ...] = ()  # a packed tensor's native parts (``native`` the first)
    reshape: tuple[int, ...] | None = None  # the canonical shape, another view (MapEntry)


@dataclass(frozen=True)
class Rewrite:
    """One direction of a prefix or regex entry: a pattern matched at the start of a name
    and what replaces the match, literal texts and group numbers (a group's value
    translated where ``tables`` has one); the rest of the name is kept."""

    pattern: re.Pattern[str]
    parts: tuple[str | int, ...]
    tables: Mapping[int, Mapping[str, str]] = field(default_factory=dict)

    def apply(self, name: str) -> str | None:
        found = self.pattern.match(name)
        if found is None:
            return None
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                value = found.group(part)
                out.append(self.tables.get(part, {}).get(value, value))
        return "".join(out) + name[found.end() :]


@dataclass(frozen=True)
class Rule:
    """A prefix or regex entry: renames names starting with a pattern, both ways."""

    key: str  # as written in the map
    forward: Rewrite  # canonical-side names -> native
    backward: Rewrite  # native names -> canonical
    kind: str | None = None

    def to_native(self, name: str) -> str | None:
        return self.forward.apply(name)

    def to_canonical(self, name: str) -> str | None:
        return self.backward.apply(name)


@dataclass
class UserMap:
    """A user's map for one format: exact entries by canonical name, then rules in order."""

    exact: dict[str, UserEntry]
    rules: list[Rule] = field(default_factory=list)

    def __getitem__(self, name: str) -> UserEntry:
        return self.exact[name]

    def rule_for_canonical(self, name: str) -> tuple[Rule, str] | None:
        for rule in self.rules:
            native = rule.to_native(name)
            if native is not None:
                return rule, native
        return None

    def rule_for_native(self, name: str) -> tuple[Rule, str] | None:
        for rule in self.rules:
            canonical = rule.to_canonical(name)
            if canonical is not None:
                return rule, canonical
        return None


def load_map(source: PathLike | Mapping[str, Any]) -> dict[str | None, UserMap]:
    """Parse a user map (a JSON file or the same structure in Python). Returns the
    entries per format; the key None holds a map that names no format."""
    what = "the map"
    if isinstance(source, Mapping):
        data: Any = source
    else:
        what = f"map file {source}"
        data = read_json(source, "the map file")
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{what} must be a non-empty JSON object {{canonical name: entry}}.")
    if UNVERIFIED in data:
        raise ConfigError(
            f"{what} was written by a port that did not verify ({data[UNVERIFIED]}); its entries "
            f"may be wrong. Check them (polytrain port's report names the failing layer), then "
            f'delete its "{UNVERIFIED}" key to use it.'
        )
    per_framework = set(data) <= set(native_io.formats()) and all(
        isinstance(v, Mapping) and not set(v) & set(_KEYS) for v in data.values()
    )
    if per_framework:
        return {fw: _parse(entries, f"{what} [{fw}]") for fw, entries in data.items()}
    return {None: _parse(data, what)}


_KEYS = ("native", "transpose", "kind", "shape", "reshape")
_HOW = (
    '{"native": "name in the file", "transpose": false}, {"kind": "Linear"}, or just '
    '"name in the file" (a packed tensor: {"native": [its parts], "transpose": true})'
)


def _parse(data: Any, what: str) -> UserMap:
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{what} must be a non-empty object {{canonical name: entry}}.")
    out = UserMap({})
    for name, value in data.items():
        if isinstance(value, str):
            value = {"native": value}
        try:
            entry = _entry(value)
            if str(name).startswith(REGEX) or str(name).endswith("."):
                out.rules.append(_rule(str(name), entry))
            else:
                out.exact[str(name)] = entry
        except (KeyError, TypeError, ValueError, re.error) as exc:
            raise ConfigError(
                f"{what}: entry {name!r} is {value!r}; write {_HOW} ({exc})."
            ) from None
    natives = [n for e in out.exact.values() for n in (e.parts or [e.native]) if n is not None]
    dupes = sorted({n for n in natives if natives.count(n) > 1})
    if dupes:
        raise ConfigError(f"{what} maps several canonical names to {name_list(dupes, LIST_MAX)}.")
    return out


def _entry(value: Any) -> UserEntry:
    if not isinstance(value, Mapping) or not value:
        raise TypeError("needs 'native', 'transpose' or 'kind'")
    unknown = set(value) - set(_KEYS)
    if unknown:
        raise TypeError(f"unknown keys {sorted(unknown)}")
    native = value.get("native")
    parts: tuple[str, ...] = ()
    if isinstance(native, list):
        parts = tuple(native)
        if len(parts) < 2 or not all(isinstance(n, str) for n in parts):
            raise TypeError("'native' is a name, or a list of two or more (a packed tensor)")
        native = parts[0]
    elif native is not None and not isinstance(native, str):
        raise TypeError("'native' is a name")
    transpose = value.get("transpose")
    if "transpose" in value and not isinstance(transpose, bool):
        raise TypeError(
            "'transpose' is true (a weight stored transposed, like Paddle's Linear [in, out]) "
            "or false: decide it for this tensor"
        )
    kind = value.get("kind")
    if kind is not None and kind not in known_kinds():
        raise ValueError(f"'kind' is one of {', '.join(known_kinds())}")
    if kind is not None and transpose is not None:
        raise TypeError("give 'kind' or 'transpose', not both")
    shape, reshape = (value.get(key) for key in ("shape", "reshape"))
    if reshape is not None and (shape is None or np.prod(shape) != np.prod(reshape)):
        raise ValueError("'reshape' is a view of 'shape' (as many values), which it needs")
    return UserEntry(native, transpose, kind, _dims(shape), parts, _dims(reshape))


def _dims(shape: Any) -> tuple[int, ...] | None:
    return None if shape is None else tuple(int(s) for s in shape)


def _reshaped(value: np.ndarray, shape: tuple[int, ...], what: str) -> np.ndarray:
    if value.size != int(np.prod(shape)):
        raise CheckpointError(f"{what}: a {list(value.shape)} tensor is no {list(shape)} one.")
    return value.reshape(shape)


def known_kinds() -> list[str]:
    """The layer kinds a map may name: those every format is described against and those
    of the formats' layout rules."""
    kinds = set(LAYER_KINDS)
    for fmt in native_io.formats().values():
        rules = fmt.layout
        kinds |= set(rules.renames) | set(rules.transposed) | set(rules.constants)
    return sorted(kinds)


def _rule(key: str, entry: UserEntry) -> Rule:
    if entry.transpose is not None or entry.shape is not None or entry.parts or entry.reshape:
        raise TypeError("a prefix or re: entry takes 'native' and 'kind' only")
    if key.startswith(REGEX):
        return _regex_rule(key, entry)
    native = entry.native if entry.native is not None else key
    if not native.endswith("."):
        raise ValueError("a prefix entry's 'native' ends with '.' too")
    forward = Rewrite(re.compile(re.escape(key)), (native,))
    return Rule(key, forward, Rewrite(re.compile(re.escape(native)), (key,)), entry.kind)


def _regex_rule(key: str, entry: UserEntry) -> Rule:
    pattern = key.removeprefix(REGEX)
    forward = re.compile(pattern)
    if entry.native is None:  # a kind for the names it matches, no renaming
        same = Rewrite(forward, (0,))
        return Rule(key, same, same, entry.kind)
    parts, end = _pattern_parts(pattern)
    groups = [src for kind, src in parts if kind == "group"]
    template = _template_parts(entry.native, len(groups))
    refs = [ref for ref, _ in template if isinstance(ref, int)]
    if sorted(refs) != list(range(1, len(groups) + 1)):
        raise ValueError("each (group) of the pattern must appear once in 'native' (\\1, \\2, ...)")
    tables = {
        ref: _table(groups[ref - 1], alts)
        for ref, alts in template
        if isinstance(ref, int) and alts
    }
    backward = "".join(
        re.escape(text)
        if isinstance(text, str)
        else "(" + ("|".join(map(re.escape, alts)) if alts else groups[text - 1]) + ")"
        for text, alts in template
    )
    position = {ref: i + 1 for i, ref in enumerate(refs)}  # key group -> native group
    group_no = iter(range(1, len(groups) + 1))
    backward_parts = tuple(
        position[next(group_no)] if kind == "group" else src for kind, src in parts
    )
    return Rule(
        key,
        Rewrite(forward, tuple(ref for ref, _ in template), tables),
        Rewrite(re.compile(backward + end), backward_parts,
                {position[g]: {v: k for k, v in t.items()} for g, t in tables.items()}),
        entry.kind,
    )  # fmt: skip


def _table(group: str, alternatives: list[str]) -> dict[str, str]:
    """A group's translation: its plain alternatives, in order, to those of ``native``."""
    try:
        own = [_literal(alt) for alt in _split_alternatives(group)]
    except ValueError:
        own = []
    if len(own) != len(alternatives) or len(set(own)) < len(own):
        raise ValueError(
            f"'native' translates ({group}) to ({'|'.join(alternatives)}): that needs a group "
            "of as many different plain alternatives, e.g. (1|2) -> (4|5)"
        )
    if len(set(alternatives)) < len(alternatives):
        raise ValueError(f"({'|'.join(alternatives)}) repeats a name: it cannot be read back")
    return dict(zip(own, alternatives, strict=True))


def _split_alternatives(group: str) -> list[str]:
    return re.split(r"(?<!\\)\|", group)


def _literal(text: str) -> str:
    """The plain text a regex fragment matches, where it is plain text."""
    out, i = "", 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and not text[i + 1].isalnum():
            out, i = out + text[i + 1], i + 2
        elif text[i] in "\\.^$*+?{}[]|()":
            raise ValueError(f"{text!r} is not plain text (write \\. for a dot)")
        else:
            out, i = out + text[i], i + 1
    if not out:
        raise ValueError("an empty alternative cannot be translated")
    return out


def _pattern_parts(pattern: str) -> tuple[list[tuple[str, str]], str]:
    """[("text", literal) | ("group", source)] of a regex that can be read both ways, and
    "$" when it is anchored at the end."""
    parts: list[tuple[str, str]] = []
    i, end = (1 if pattern.startswith("^") else 0), ""
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            parts.append(("text", pattern[i + 1]))
            i += 2
        elif ch == "(":
            depth, j = 1, i + 1
            while j < len(pattern) and depth:
                depth += {"(": 1, ")": -1}.get(pattern[j], 0)
                j += 2 if pattern[j] == "\\" else 1
            source = pattern[i + 1 : j - 1]
            if depth or source.startswith("?") or re.compile(source).groups:
                raise ValueError("groups are plain (...) and not nested")
            parts.append(("group", source))
            i = j
        elif ch == "$" and i == len(pattern) - 1:
            end, i = "$", i + 1
        elif ch == "\\":
            raise ValueError(f"{pattern[i : i + 2]} outside a (group): put it in one")
        elif ch in ".^$*+?{}[]|)":
            raise ValueError(f"outside a (group) the pattern is literal text: write \\{ch}")
        else:
            parts.append(("text", ch))
            i += 1
    return parts, end


def _template_parts(template: str, groups: int) -> list[tuple[str | int, list[str]]]:
    """[(literal, []) | (group number, translation)] of a replacement like
    ``stage\\1.`` or ``features.\\1(4|5).`` (translation: [] for a copied group)."""
    parts: list[tuple[str | int, list[str]]] = []
    ref = r"(?:\\(\d+)|\\g<(\d+)>)(?:\(([^()]*)\))?"
    pos = 0
    for found in re.finditer(ref, template):
        parts.append((template[pos : found.start()], []))
        number = int(found.group(1) or found.group(2))
        alts = [] if found.group(3) is None else found.group(3).split("|")
        if any(not a or "\\" in a for a in alts):
            raise ValueError("a translation (a|b) lists plain names")
        parts.append((number, alts))
        pos = found.end()
    parts.append((template[pos:], []))
    parts = [(text, alts) for text, alts in parts if text != ""]
    if any(isinstance(text, str) and "\\" in text for text, _ in parts):
        raise ValueError("'native' holds text and group references (\\1, \\g<2>) only")
    if any(isinstance(ref, int) and ref > groups for ref, _ in parts):
        raise ValueError("'native' refers to a group the pattern lacks")
    return parts


def undecided_message(what: str, nmap: NameMap, shapes: Mapping[str, tuple[int, ...]],
                      evidence: str, transposed: str) -> str:  # fmt: skip
    """The one message for tensors whose layout nothing establishes."""
    names = nmap.undecided()
    listed = name_list(
        [f"{n} {tuple(shapes.get(n, ()))}" + _native_note(nmap, n) for n in names], LIST_MAX
    )
    example = json.dumps({names[0]: {"kind": "Linear"}})
    return (
        f"{what}: the layout of {len(names)} 2-D tensor(s) is not known: {listed}. "
        f"{transposed}; nothing in {evidence} says which these are, and polytrain never "
        f"guesses from a name or a shape. Resolve it with a map entry for each (--map FILE, "
        f'e.g. {example}, or {{"transpose": false}} for a tensor that is not one; '
        "polytrain convert --print-map writes a map to edit), with --model NAME for a "
        "built-in model, or from the model objects with polytrain port (docs/porting.md)."
    )


def _native_note(nmap: NameMap, name: str) -> str:
    native = nmap.entries[name].native
    return "" if native == name else f" (in the file: {native})"
