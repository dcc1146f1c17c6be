"""The mapping table of ``polytrain port-code``: one entry per source API, read from the
TOML files beside this module (data, not code: the core names no framework in code).

A file holds one source framework: ``[framework]`` (its import root, the target's root,
the module equivalents that keep an import alias) and ``[[api]]`` entries. An entry maps a
call (``paddle.nn.Linear``), a reference (``paddle.nn.Layer``, ``paddle.float32``) or a
method (``.clear_grad``, any receiver) to its target, with the argument transformation,
the semantics rule where the frameworks differ, and an example its test runs."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError

TABLE_DIR = Path(__file__).parent
ANY = "*"  # in ``drop``: any value is dropped (it does not change a number)
ARG_KEYS = {
    "name", "to", "drop", "convert", "template", "default", "why", "wrap", "others", "edits",
}  # fmt: skip
KINDS = ("call", "reference", "method", "context", "scheduler")


@dataclass(frozen=True)
class Arg:
    """One source parameter, in the source's positional order.

    ``to``: the target keyword ("" = the same name; None: dropped). ``drop``: source values
    (Python literals as code, or ``*``) the target has no argument for and behaves as;
    ``convert``: source literal -> target code; ``template``: target code around the value
    (``1 - {}``); ``default``: target code written when the source omits the argument
    (the defaults differ); ``why``: why any other value cannot be converted; ``wrap``: the
    converted value is a layer that follows the call (``act="relu"``); ``others``: values
    not listed pass as they are. A ``to`` of ``name.0`` / ``name.1`` builds one target
    tuple from two source arguments (Adam's ``beta1``, ``beta2`` -> ``betas``); each part
    then needs its ``default``. ``edits``: source literal -> (another source argument,
    target code around that argument's value): ``transpose_y=True`` makes ``y`` ``y.mT``
    and is itself dropped."""

    name: str
    to: str | None = ""
    drop: tuple[str, ...] = ()
    convert: Mapping[str, str] = field(default_factory=dict)
    template: str | None = None
    default: str | None = None
    why: str = ""
    wrap: bool = False
    others: bool = False
    edits: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def target_name(self) -> str | None:
        if self.to is None:
            return None
        return self.to or self.name


@dataclass(frozen=True)
class Entry:
    """One API: ``source`` (qualified name, or ``.name`` for a method), ``target`` (empty
    when the API is known but not converted: ``unsupported`` says why)."""

    source: str
    target: str
    kind: str = "call"
    args: tuple[Arg, ...] = ()
    positional: tuple[str, ...] = ()
    target_by: tuple[str, Mapping[str, str]] | None = None
    rule: str = ""
    note: str = ""
    unsupported: str = ""
    example: str = ""
    stand_in: str = ""
    check: str = "value"
    inputs: Mapping[str, str] = field(default_factory=dict)
    tolerance: float | None = None
    differs: tuple[str, ...] = ()

    @property
    def is_method(self) -> bool:
        return self.source.startswith(".")

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.args if a.name == name), None)


@dataclass(frozen=True)
class Framework:
    """A source framework's table: its import root, the target's, the module equivalents
    (an alias of a source module becomes an alias of its target module), what a wrapped
    layer is wrapped in, and the entries by source name."""

    name: str
    root: str
    target_root: str
    modules: Mapping[str, str]
    sequential: str
    entries: Mapping[str, Entry]
    methods: Mapping[str, Entry]


def literal(code: str) -> Any:
    """The value of a Python literal written as code (a ConfigError when it is not one)."""
    try:
        return ast.literal_eval(code)
    except (ValueError, SyntaxError) as exc:
        raise ConfigError(f"{code!r} in the port-code table is not a Python literal.") from exc


def _arg(raw: str | Mapping[str, Any], where: str) -> Arg:
    if isinstance(raw, str):
        return Arg(raw)
    unknown = set(raw) - ARG_KEYS
    if unknown or "name" not in raw:
        raise ConfigError(f"{where}: bad argument entry {dict(raw)} ({sorted(unknown)}).")
    to = raw.get("to", "")
    drop = tuple(raw.get("drop", ()))
    edits = {key: (str(v[0]), str(v[1])) for key, v in raw.get("edits", {}).items()}
    for code in (*(d for d in drop if d != ANY), *raw.get("convert", {}), *edits):
        literal(code)
    return Arg(
        name=raw["name"],
        to=None if to == "-" else to,
        drop=drop,
        convert=dict(raw.get("convert", {})),
        template=raw.get("template"),
        default=raw.get("default"),
        why=raw.get("why", ""),
        wrap=bool(raw.get("wrap", False)),
        others=bool(raw.get("others", False)),
        edits=edits,
    )


def _entry(raw: Mapping[str, Any]) -> Entry:
    where = f"port-code table entry {raw.get('source', '?')}"
    known = set(Entry.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown or "source" not in raw:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}.")
    kind = raw.get("kind", "method" if raw["source"].startswith(".") else "call")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}.")
    target_by = None
    if "target_by" in raw:
        target_by = (raw["target_by"]["name"], dict(raw["target_by"]["map"]))
    return Entry(
        source=raw["source"],
        target=raw.get("target", ""),
        kind=kind,
        args=tuple(_arg(a, where) for a in raw.get("args", ())),
        positional=tuple(raw.get("positional", ())),
        target_by=target_by,
        rule=raw.get("rule", ""),
        note=raw.get("note", ""),
        unsupported=raw.get("unsupported", ""),
        example=raw.get("example", ""),
        stand_in=raw.get("stand_in", ""),
        check=raw.get("check", "value"),
        inputs=dict(raw.get("inputs", {})),
        tolerance=raw.get("tolerance"),
        differs=tuple(raw.get("differs", ())),
    )


def load_framework(path: Path) -> Framework:
    """One table file."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    head = data["framework"]
    entries: dict[str, Entry] = {}
    methods: dict[str, Entry] = {}
    for raw in data.get("api", ()):
        entry = _entry(raw)
        book = methods if entry.is_method else entries
        if entry.source in book:
            raise ConfigError(f"{path.name}: {entry.source} is in the table twice.")
        book[entry.source] = entry
    return Framework(
        name=head["name"],
        root=head["root"],
        target_root=head["target_root"],
        modules=dict(head.get("modules", {})),
        sequential=head.get("sequential", ""),
        entries=entries,
        methods=methods,
    )


@cache
def frameworks() -> dict[str, Framework]:
    """Every table, by source import root."""
    found = [load_framework(p) for p in sorted(TABLE_DIR.glob("*.toml"))]
    merged: dict[str, Framework] = {}
    for fw in found:
        if fw.root in merged:  # several files may hold one framework (e.g. its 1.x API)
            old = merged[fw.root]
            twice = (set(old.entries) & set(fw.entries)) | (set(old.methods) & set(fw.methods))
            if twice:
                raise ConfigError(f"{sorted(twice)[0]} is in two port-code tables.")
            fw = Framework(
                old.name, old.root, old.target_root, {**old.modules, **fw.modules},
                old.sequential or fw.sequential, {**old.entries, **fw.entries},
                {**old.methods, **fw.methods},
            )  # fmt: skip
        merged[fw.root] = fw
    return merged


def all_entries() -> list[Entry]:
    """Every entry of every table, calls and references first, then methods."""
    out: list[Entry] = []
    for fw in frameworks().values():
        out.extend(fw.entries.values())
        out.extend(fw.methods.values())
    return out
