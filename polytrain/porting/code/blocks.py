"""The keyword arguments a block class passes on to its framework base.

A class derived from a framework's block takes the block's own keyword arguments (Gluon's
``prefix=``, ``params=``) and passes them on: ``super().__init__(**kwargs)``. Converted,
the base is PyTorch's Module, which takes none: those arguments go through the helper of
the base's entry (its ``subclass_kwargs``), ``super().__init__(**helper(**kwargs))``,
which drops what only names parameters and refuses what PyTorch's Module cannot do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

INIT = "__init__"


@dataclass
class Blocks:
    """The ``super().__init__(...)`` calls of block classes: call -> the helper."""

    calls: dict[cst.Call, str] = field(default_factory=dict)

    def leave_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """The call's keyword arguments given through the helper:
        ``super().__init__(**helper(prefix=p, **kwargs))``."""
        helper = self.calls.get(original)
        if helper is None:
            return updated
        positional = [a for a in updated.args if a.keyword is None and not a.star]
        passed = [a for a in updated.args if a not in positional]
        if not passed:
            return updated
        passed[-1] = passed[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        through = cst.Call(cst.Name(helper), args=passed)
        return updated.with_changes(args=[*positional, cst.Arg(through, star="**")])


def find(module: cst.Module, helper_of: Callable[[cst.BaseExpression], str]) -> Blocks:
    """The ``super(...).__init__(...)`` calls in the ``__init__`` of each class of
    ``module`` whose base has a helper (``helper_of(base)``: its name, or '')."""
    out = Blocks()

    class Finder(cst.CSTVisitor):
        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            helper = next((h for b in node.bases if (h := helper_of(b.value))), "")
            if not helper or not isinstance(node.body, cst.IndentedBlock):
                return
            for statement in node.body.body:
                if isinstance(statement, cst.FunctionDef) and statement.name.value == INIT:
                    for call in _super_inits(statement):
                        out.calls[call] = helper

    module.visit(Finder())
    return out


def _super_inits(node: cst.FunctionDef) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == INIT
                and isinstance(func.value, cst.Call)
                and isinstance(func.value.func, cst.Name)
                and func.value.func.value == "super"
            ):
                found.append(call)

        def visit_FunctionDef(self, inner: cst.FunctionDef) -> bool:
            return inner is node  # a nested function's calls are not the class's

        def visit_ClassDef(self, inner: cst.ClassDef) -> bool:
            return False

    node.visit(Finder())
    return found
