"""Gluon functions on arrays: a ``dtype=`` given as a numpy type (``dtype=np.int32``,
numpy's or MXNet's numpy interface's) is read as its name (``'int32'``) where the table
entry converts that name, so the table's own dtype conversion applies to it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

import libcst as cst

from polytrain.porting.code.arguments import code
from polytrain.porting.code.layer_self import enclosing_method
from polytrain.porting.code.table import Entry, Framework

NUMPY_MODULES = ("numpy.", "mxnet.np.", "mxnet.numpy.")  # where ``np.int32`` is numpy's type


def dtype_name(names: Collection[str]) -> str | None:
    """The numpy type's name (``int32``) among a value's qualified names, or None."""
    for name in names:
        for module in NUMPY_MODULES:
            rest = name[len(module) :]
            if name.startswith(module) and rest.isidentifier():
                return rest
    return None


def numpy_dtypes(
    entry: Entry,
    original: Sequence[cst.Arg],
    updated: Sequence[cst.Arg],
    names_of: Callable[[cst.CSTNode], Collection[str]],
) -> list[cst.Arg]:
    """``updated`` with each keyword argument whose original value is a numpy type the
    entry's ``convert`` lists by name written as that name (``dtype=np.int32`` ->
    ``dtype='int32'``); any other argument as it is."""
    out = list(updated)
    for i, (before, after) in enumerate(zip(original, updated, strict=False)):
        spec = entry.arg(before.keyword.value) if before.keyword is not None else None
        if spec is None or not spec.convert:
            continue
        name = dtype_name(names_of(before.value))
        if name is not None and f"'{name}'" in spec.convert:
            out[i] = after.with_changes(value=cst.SimpleString(f"'{name}'"))
    return out


class _Bindings(cst.CSTVisitor):
    """Each name a module binds (assigned, a parameter, a loop or import target), how
    often, and the module-level ``X = sys.modules[__name__]`` assignments."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.itself: set[str] = set()
        self.depth = 0

    def _bind(self, name: str) -> None:
        self.count[name] = self.count.get(name, 0) + 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        for name in _names_in(node.target):
            self._bind(name)

    def visit_Assign(self, node: cst.Assign) -> None:
        this = code(node.value).strip() == "sys.modules[__name__]"
        if this and self.depth == 0 and len(node.targets) == 1:
            target = node.targets[0].target
            if isinstance(target, cst.Name):
                self.itself.add(target.value)

    def visit_For(self, node: cst.For) -> None:
        for name in _names_in(node.target):
            self._bind(name)

    def visit_AsName(self, node: cst.AsName) -> None:
        for name in _names_in(node.name):
            self._bind(name)


def _names_in(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple | cst.List):
        return [n for e in target.elements for n in _names_in(e.value)]
    return []


def module_itself(module: cst.Module) -> set[str]:
    """The names bound once, at module level, to the module itself (d2l's
    ``d2l = sys.modules[__name__]``): ``d2l.exp(x)`` calls the file's own function ``exp``,
    not a tensor's method."""
    found = _Bindings()
    module.visit(found)
    return {n for n in found.itself if found.count.get(n) == 1}


MODE_ARG = "training"  # an entry's argument for Gluon's training mode, needed (F.Dropout)
TRAINING = "self.training"  # a converted block's mode: Gluon's autograd train mode


def block_bases(frameworks: Iterable[Framework]) -> set[str]:
    """The framework classes whose subclasses become PyTorch modules (Gluon's Block and
    HybridBlock): the entries whose target is the module class beside the table's
    ``sequential`` (its torch.nn.Module)."""
    found: set[str] = set()
    for fw in frameworks:
        home = fw.sequential.rpartition(".")[0]
        found |= {n for n, e in fw.entries.items() if home and e.target == f"{home}.Module"}
    return found


def in_block_method(
    node: cst.CSTNode,
    parent: Callable[[cst.CSTNode], cst.CSTNode | None],
    blocks: Collection[cst.ClassDef],
) -> bool:
    """``node`` is in a method (``self`` first, not nested in another function) of one of
    ``blocks`` (the file's Gluon blocks, PyTorch modules once converted)."""
    method = enclosing_method(node, parent)
    if method is None or method[0].decorators:
        return False
    params = method[0].params.params
    return bool(params) and params[0].name.value == "self" and method[1] in blocks


def with_mode(entry: Entry, args: Sequence[cst.Arg], in_block: bool) -> list[cst.Arg]:
    """A call active only in Gluon's training mode (``F.Dropout``: its entry needs a
    ``training`` argument) given ``training=self.training`` inside a block's method: the
    converted module's mode, which ``net.train()``/``net.eval()`` set as
    ``autograd.record()`` and predict mode do in Gluon. Elsewhere the argument is missing
    and the call is marked with the entry's ``need``."""
    spec = entry.arg(MODE_ARG)
    given = any(a.keyword is not None and a.keyword.value == MODE_ARG for a in args)
    if spec is None or not spec.need or given or not in_block:
        return list(args)
    last = list(args)
    if last and last[-1].comma is cst.MaybeSentinel.DEFAULT:
        space = cst.SimpleWhitespace(" ")
        last[-1] = last[-1].with_changes(comma=cst.Comma(whitespace_after=space))
    value = cst.parse_expression(TRAINING)
    equal = cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
    )
    return [*last, cst.Arg(value=value, keyword=cst.Name(MODE_ARG), equal=equal)]
