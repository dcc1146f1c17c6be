"""What every rule family of one ``port-code`` pass asks and records, and the pass's state.

Asks: the framework API a name resolves to through its imports (libcst's qualified names
resolve ``import paddle.nn as nn``, ``from paddle import nn`` and the rest) and its table
entry, a node's line, statement and parent. Records: a use converted (``done``) or left in
place under a marker comment naming the API and the reason (``left``), and the target
roots and table helpers the converted code needs. ``PortPass`` is the base class of
transformer.PortTransformer; the rule families are functions of it."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import (
    CodeRange,
    ParentNodeProvider,
    PositionProvider,
    QualifiedName,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from polytrain.porting.code import blocks, hybrid, pairing
from polytrain.porting.code.arguments import code
from polytrain.porting.code.report import Use
from polytrain.porting.code.table import Entry, Framework

MARKER = "# polytrain port-code: {api} not converted: {why}"
STATEMENT = "(statement)"  # the API a statement left whole after a failure is reported as
FOREIGN = "(another module)"  # what made a name assigned from a call of a non-framework import
NOT_IN_TABLE = "not in the mapping table yet"
Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement


def framework_of(name: str, tables: Mapping[str, Framework]) -> Framework | None:
    root = name.split(".", 1)[0]
    return tables.get(root)


@dataclass(frozen=True)
class Resolved:
    framework: Framework
    name: str  # the qualified name, e.g. paddle.nn.Linear


class PortPass(cst.CSTTransformer):
    """One pass over a module. ``aliases``: import aliases of source modules kept as
    aliases of their target modules (local name -> target module); the other converted
    uses are written with the target's full name (``needs_root`` then says so)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, ParentNodeProvider, PositionProvider)

    def __init__(
        self,
        tables: Mapping[str, Framework],
        imported: Iterable[str],
        aliases: Mapping[str, str],
        skip: Mapping[tuple[int, int], str] | None = None,
    ) -> None:
        super().__init__()
        self.skip = dict(skip or {})  # statement position -> the error that left it whole
        self.inside: list[tuple[int, int]] = []  # positions of the statements being visited
        self.tables = tables
        self.imported = [tables[r] for r in imported if r in tables]  # method tables in use
        self.aliases = dict(aliases)
        self.uses: list[Use] = []
        self.needs_root: set[str] = set()
        self.helpers: dict[str, str] = {}  # table helpers the converted code calls: name -> code
        # statements (statements.py): marked, flattened, added to, removed, converted into
        self.markers: dict[cst.CSTNode, list[str]] = {}
        self.flatten: set[cst.CSTNode] = set()
        self.then: dict[cst.CSTNode, str] = {}  # statement -> a statement added after it
        self.removed: set[cst.CSTNode] = set()
        self.made: dict[cst.CSTNode, list[cst.CSTNode]] = {}
        self.pairs = pairing.Pairs()  # schedulers and optimizers, steps and backwards
        self.call_funcs: set[cst.CSTNode] = set()  # the ``func`` of every call visited
        self.made_by: dict[str, str] = {}  # receiver code -> the API whose call made it
        # what the module is (transformer.py's visit_Module)
        self.hybrid = hybrid.Hybrid()  # Gluon's hybrid_forward(self, F, ...)
        self.modes: dict[cst.Comparison, tuple[bool, str]] = {}  # ``F == nd``: constant
        self.block_inits = blocks.Blocks()  # super().__init__(**kwargs) of blocks
        self.filled: set[cst.Call] = set()  # ``out.add(nn.Conv2D(...))``, out a parameter
        self.layers: set[cst.ClassDef] = set()  # classes derived from a layer
        self.itself: set[str] = set()  # names of the module itself
        self.gluon_blocks: set[cst.ClassDef] = set()  # classes derived from a Gluon Block

    # -- lookups ------------------------------------------------------------------------

    def resolved(self, node: cst.CSTNode) -> Resolved | None:
        """The framework API ``node`` names, and its table."""
        if not dotted(node):  # ``f(x).detach``: an attribute of a value, not a name
            return None
        if self.hybrid.head(node) is not None:  # ``F.x``: the table's module's x
            owner = next(f for f in self.imported if f.module_parameter == self.hybrid.param)
            name = owner.module_parameter_as + code(node).strip()[len(self.hybrid.param) :]
            return Resolved(owner, owner.canonical(name))
        none: Collection[QualifiedName] = ()
        names = self.get_metadata(QualifiedNameProvider, node, none)
        for q in sorted(names, key=lambda q: q.name):
            if q.source is QualifiedNameSource.IMPORT:
                fw = framework_of(q.name, self.tables)
                if fw is not None:
                    return Resolved(fw, fw.canonical(q.name))
        return None

    def qualified(self, node: cst.BaseExpression) -> str | None:
        found = self.resolved(node)
        return found.name if found is not None else None

    def names_of(self, node: cst.CSTNode) -> set[str]:
        """The qualified names of a name or attribute (``np.int32``: numpy.int32)."""
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, ())}

    def entry_named(self, node: cst.BaseExpression) -> Entry | None:
        """The table entry of the framework API ``node`` names, if any."""
        found = self.resolved(node)
        return found.framework.entries.get(found.name) if found else None

    def entry_of(self, call: cst.Call) -> Entry | None:
        return self.entry_named(call.func)

    def method_entry(self, name: str) -> Entry | None:
        """The entry of the method ``name`` in the first table in use that has one."""
        for fw in self.imported:
            entry = fw.methods.get("." + name)
            if entry is not None:
                return entry
        return None

    def foreign(self, receiver: cst.BaseExpression) -> bool:
        """``receiver`` names something imported from another module than the frameworks'
        (``math`` in ``math.exp(x)``, ``np`` in ``np.sqrt(x)``): a function of that module
        is called, not a tensor's method."""
        if not dotted(receiver):
            return False
        none: Collection[QualifiedName] = ()
        names = self.get_metadata(QualifiedNameProvider, receiver, none)
        imports = [q for q in names if q.source is QualifiedNameSource.IMPORT]
        return bool(imports) and all(framework_of(q.name, self.tables) is None for q in imports)

    def line(self, node: cst.CSTNode) -> int:
        where: CodeRange = self.get_metadata(PositionProvider, node)
        return where.start.line

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        where: CodeRange = self.get_metadata(PositionProvider, node)
        return where.start.line, where.start.column

    def statement(self, node: cst.CSTNode) -> cst.CSTNode:
        current = node
        while not isinstance(current, Statement):
            current = self.get_metadata(ParentNodeProvider, current)
        return current

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.get_metadata(ParentNodeProvider, node, None)

    # -- results --------------------------------------------------------------------------

    def done(self, node: cst.CSTNode, api: str) -> None:
        self.uses.append(Use(self.line(node), api))

    def left(self, node: cst.CSTNode, api: str, why: str) -> None:
        why = " ".join(why.split())  # a comment is one line: a multi-line argument joined
        self.uses.append(Use(self.line(node), api, why))
        self.markers.setdefault(self.statement(node), []).append(MARKER.format(api=api, why=why))

    def target_expr(self, original: cst.BaseExpression, target: str) -> cst.BaseExpression:
        """``target`` through a kept alias when the use went through one, else in full."""
        head = original
        while isinstance(head, cst.Attribute):
            head = head.value
        if isinstance(head, cst.Name) and head.value in self.aliases:
            module = self.aliases[head.value]
            if target.startswith(module + "."):
                return cst.parse_expression(head.value + target[len(module) :])
        return self.full(target)

    def full(self, text: str) -> cst.BaseExpression:
        for fw in self.tables.values():
            if text == fw.target_root or text.startswith(fw.target_root + "."):
                self.needs_root.add(fw.target_root)
            if text in fw.helpers:
                self.helper(fw, text)
            elif "(" in text:  # a target through a helper: ``gluon_deferred(...)``
                self.helpers_named(fw, text)
        return cst.parse_expression(text)

    def helper(self, fw: Framework, name: str) -> None:
        """A table helper the converted code calls: defined in the file with the helpers
        its code names, their imports added."""
        if name in self.helpers:
            return
        self.helpers[name] = fw.helpers[name]
        if f"{fw.target_root}." in fw.helpers[name]:
            self.needs_root.add(fw.target_root)
        self.helpers_named(fw, fw.helpers[name])

    def helpers_named(self, fw: Framework, text: str) -> None:
        """The helpers ``text`` names: the framework's own, else another table's (a d2lzh
        loader reads Gluon's datasets)."""
        for table in (fw, *(f for f in self.tables.values() if f is not fw)):
            for other in table.helpers:
                own = table is fw or other not in fw.helpers
                if own and re.search(rf"\b{other}\b", text):
                    self.helper(table, other)

    def table_code(self, fw: Framework, text: str) -> cst.BaseExpression:
        """Code from the table (a converted value, a wrapping layer): its target names are
        written in full, the helpers it names defined."""
        if fw.target_root in text:
            self.needs_root.add(fw.target_root)
        self.helpers_named(fw, text)
        return cst.parse_expression(text)

    def roots_named(self, written: str) -> None:
        """The target roots (``torch``) that code written into a method's use names: their
        imports are added."""
        self.needs_root.update(
            fw.target_root for fw in self.imported if f"{fw.target_root}." in written
        )


def dotted(node: cst.CSTNode) -> bool:
    """``node`` is a name or a chain of attributes of one (``a.b.c``)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)
