"""The import statements of a converted module: a source import whose names are all
converted goes (a module alias becomes the same alias of its target module), one still
used by a marked call stays, and the target's root is imported where full names need it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import takewhile

import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, QualifiedNameSource

from polytrain.porting.code.table import Framework


@dataclass(frozen=True)
class Binding:
    """A name an import statement binds: its local name and what it imports."""

    local: str
    imported: str  # qualified, e.g. paddle.nn
    is_module_alias: bool  # ``import a.b as x`` / ``from a import b``: keepable as an alias


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    assert isinstance(node, cst.Attribute)
    return f"{_dotted(node.value)}.{node.attr.value}"


def bindings(module: cst.Module, tables: Mapping[str, Framework]) -> list[Binding]:
    """Every source-framework name bound by an import anywhere in the module."""
    found: list[Binding] = []

    class Finder(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            for alias in node.names:
                name = _dotted(alias.name)
                if name.split(".")[0] not in tables:
                    continue
                if alias.asname is not None:
                    local = _dotted(alias.asname.name)
                    found.append(Binding(local, name, "." in name))
                else:
                    found.append(Binding(name.split(".")[0], name.split(".")[0], False))

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
                return
            base = _dotted(node.module)
            if base.split(".")[0] not in tables:
                return
            for alias in node.names:
                name = f"{base}.{_dotted(alias.name)}"
                asname = alias.asname.name if alias.asname is not None else alias.name
                found.append(Binding(_dotted(asname), name, True))

    module.visit(Finder())
    return found


def keepable_aliases(
    module: cst.Module, tables: Mapping[str, Framework], still_used: set[str]
) -> dict[str, str]:
    """local name -> target module, for aliases of source modules with a target module
    whose every use converts."""
    out: dict[str, str] = {}
    for b in bindings(module, tables):
        fw = tables[b.imported.split(".")[0]]
        target = fw.modules.get(b.imported)
        if b.is_module_alias and target and b.local not in still_used:
            out[b.local] = target
    return out


def used_locals(module: cst.Module, tables: Mapping[str, Framework]) -> set[str]:
    """Local names of source-framework imports still referenced outside import statements."""
    used: set[str] = set()

    class Finder(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (QualifiedNameProvider,)

        def visit_Import(self, node: cst.Import) -> bool:
            return False

        def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
            return False

        def visit_Name(self, node: cst.Name) -> None:
            for q in self.get_metadata(QualifiedNameProvider, node, set()):
                if q.source is QualifiedNameSource.IMPORT and q.name.split(".")[0] in tables:
                    used.add(node.value)

    MetadataWrapper(module, unsafe_skip_copy=True).visit(Finder())
    return used


class ImportRewriter(cst.CSTTransformer):
    """Rewrites the source-framework imports once the uses are converted."""

    def __init__(
        self,
        tables: Mapping[str, Framework],
        still_used: set[str],
        aliases: Mapping[str, str],
        needs_root: set[str],
    ) -> None:
        super().__init__()
        self.tables = tables
        self.still_used = still_used
        self.aliases = aliases
        self.needs_root = set(needs_root)
        self.placed = False

    def _root_import(self) -> list[cst.BaseSmallStatement]:
        if self.placed:
            return []
        self.placed = True
        return [cst.Import(names=[cst.ImportAlias(cst.Name(r))]) for r in sorted(self.needs_root)]

    def leave_Import(
        self, original: cst.Import, updated: cst.Import
    ) -> cst.BaseSmallStatement | cst.FlattenSentinel[cst.BaseSmallStatement] | cst.RemovalSentinel:
        keep: list[cst.ImportAlias] = []
        added: list[cst.BaseSmallStatement] = []
        touched = False
        for alias in updated.names:
            name = _dotted(alias.name)
            if name.split(".")[0] not in self.tables:
                keep.append(alias)
                continue
            local = _dotted(alias.asname.name) if alias.asname else name.split(".")[0]
            if local in self.still_used:
                keep.append(alias)
                continue
            touched = True
            if local in self.aliases:
                target = self.aliases[local]
                added.append(_small(f"import {target} as {local}"))
        if not touched:
            return updated
        out: list[cst.BaseSmallStatement] = []
        if keep:
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            out.append(updated.with_changes(names=keep))
        out.extend(self._root_import())
        out.extend(added)
        return cst.FlattenSentinel(out) if out else cst.RemoveFromParent()

    def leave_ImportFrom(
        self, original: cst.ImportFrom, updated: cst.ImportFrom
    ) -> cst.BaseSmallStatement | cst.FlattenSentinel[cst.BaseSmallStatement] | cst.RemovalSentinel:
        if updated.module is None or updated.relative or isinstance(updated.names, cst.ImportStar):
            return updated
        base = _dotted(updated.module)
        if base.split(".")[0] not in self.tables:
            return updated
        keep: list[cst.ImportAlias] = []
        added: list[cst.BaseSmallStatement] = []
        for alias in updated.names:
            local = _dotted(alias.asname.name if alias.asname else alias.name)
            if local in self.still_used:
                keep.append(alias)
            elif local in self.aliases:
                parent, _, last = self.aliases[local].rpartition(".")
                text = f"from {parent} import {last}" + (f" as {local}" if last != local else "")
                added.append(_small(text))
        out: list[cst.BaseSmallStatement] = []
        if keep:
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            out.append(updated.with_changes(names=keep))
        out.extend(self._root_import())
        out.extend(added)
        return cst.FlattenSentinel(out) if out else cst.RemoveFromParent()

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        """An import line that became several imports: one line each, its comments above
        the first and its trailing comment on the last."""
        if len(original.body) != 1 or len(updated.body) < 2:
            return updated
        last = len(updated.body) - 1
        return cst.FlattenSentinel(
            [
                updated.with_changes(
                    body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
                    leading_lines=updated.leading_lines if i == 0 else [],
                    trailing_whitespace=(
                        updated.trailing_whitespace if i == last else cst.TrailingWhitespace()
                    ),
                )
                for i, small in enumerate(updated.body)
            ]
        )

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        if self.placed or not self.needs_root:
            return updated
        statement = cst.SimpleStatementLine(body=self._root_import())
        body = list(updated.body)
        at = _after_preamble(body)
        return updated.with_changes(body=[*body[:at], statement, *body[at:]])


def with_helpers(module: cst.Module, helpers: Mapping[str, str]) -> cst.Module:
    """``module`` with the table helpers (name -> code) its converted code calls defined
    after its leading imports, two blank lines around each."""
    if not helpers:
        return module
    body = list(module.body)
    at = max(_after_preamble(body, imports=True), _after_imports_of(body, helpers))
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    defs = [
        cst.parse_statement(helpers[n]).with_changes(leading_lines=blank)
        for n in _bases_first(helpers)
    ]
    if at < len(body):
        lead = list(body[at].leading_lines)
        empty = len(list(takewhile(lambda line: line.comment is None, lead)))
        body[at] = body[at].with_changes(leading_lines=[*blank[: max(0, 2 - empty)], *lead])
    return module.with_changes(body=[*body[:at], *defs, *body[at:]])


def _after_imports_of(body: Sequence[cst.CSTNode], helpers: Mapping[str, str]) -> int:
    """Index after the last top-level import that binds a module the helpers' code names
    (``import torch`` below the file's first imports: a helper class deriving from
    ``torch.nn.Module`` needs it bound when it is defined)."""
    named = {m for text in helpers.values() for m in re.findall(r"\b(\w+)\.", text)}
    at = 0
    for i, stmt in enumerate(body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import) and any(
                _bound(alias) in named for alias in small.names
            ):
                at = i + 1
    return at


def _bound(alias: cst.ImportAlias) -> str:
    """The name ``import a.b`` / ``import a.b as c`` binds."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return _dotted(alias.name).split(".")[0]


def _bases_first(helpers: Mapping[str, str]) -> list[str]:
    """The helpers' names in order, each class after the helper classes it derives from
    (``class GluonMNIST(GluonVisionDataset)``: the base must exist when it is defined)."""
    order: list[str] = []

    def place(name: str) -> None:
        if name in order:
            return
        head = re.match(r"\s*class \w+\((.*?)\):", helpers[name])
        for base in re.findall(r"\w+", head.group(1)) if head else ():
            if base in helpers and base != name:
                place(base)
        order.append(name)

    for name in sorted(helpers):
        place(name)
    return order


def _small(text: str) -> cst.BaseSmallStatement:
    stmt = cst.parse_statement(text)
    assert isinstance(stmt, cst.SimpleStatementLine)
    return stmt.body[0]


def _after_preamble(body: Sequence[cst.CSTNode], imports: bool = False) -> int:
    """Index after a docstring and ``from __future__`` imports (every leading import with
    ``imports``)."""
    at = 0
    for i, stmt in enumerate(body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            break
        small = stmt.body[0]
        doc = i == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString)
        future = (
            isinstance(small, cst.ImportFrom)
            and small.module is not None
            and (_dotted(small.module) == "__future__")
        )
        other = imports and all(isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body)
        if doc or future or other:
            at = i + 1
        else:
            break
    return at
