"""The keyword arguments a block class passes on to its framework base.

A class derived from a framework's block takes the block's own keyword arguments (Gluon's
``prefix=``, ``params=``) and passes them on: ``super().__init__(**kwargs)``. Converted,
the base is PyTorch's Module, which takes none: those arguments go through the helper of
the base's entry (its ``subclass_kwargs``), ``super().__init__(**helper(**kwargs))``,
which drops what only names parameters and refuses what PyTorch's Module cannot do.
A name filled with blocks in a function that does not make it is a container there
(``filled``)."""

from __future__ import annotations

from collections.abc import Callable, Collection
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


def filled(
    module: cst.Module, methods: Collection[str], is_block: Callable[[cst.Call], bool]
) -> set[cst.Call]:
    """The ``x.add(...)`` calls (``methods``) on a name ``x`` the module does not show
    made (a function's parameter: ``_add_conv(out, ...)``) that, in the same function,
    is given a framework block made in the call (``out.add(nn.Conv2D(...))``): ``x`` is
    a container of blocks there, so each of them is one."""
    out: set[cst.Call] = set()

    class Finder(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            calls = [c for c in _method_calls(node, methods) if isinstance(c.func, cst.Attribute)]
            receivers: dict[str, list[cst.Call]] = {}
            for call in calls:
                assert isinstance(call.func, cst.Attribute)
                if isinstance(call.func.value, cst.Name):
                    receivers.setdefault(call.func.value.value, []).append(call)
            for group in receivers.values():
                if any(is_block(inner) for call in group for inner in _inner_calls(call)):
                    out.update(group)

    module.visit(Finder())
    return out


def _method_calls(node: cst.FunctionDef, methods: Collection[str]) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in methods:
                found.append(call)

        def visit_FunctionDef(self, inner: cst.FunctionDef) -> bool:
            return inner is node

    node.visit(Finder())
    return found


def _inner_calls(call: cst.Call) -> list[cst.Call]:
    """The calls in ``call``'s arguments (``ReLU6() if relu6 else nn.Activation('relu')``)."""
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, inner: cst.Call) -> None:
            found.append(inner)

    for arg in call.args:
        arg.visit(Finder())
    return found
