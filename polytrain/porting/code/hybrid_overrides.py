"""Gluon's ``F`` passed on through ``self``: a block's ``hybrid_forward`` calling
``self._compute_weight(F, ...)`` reaches, on an instance of a subclass, that subclass's
override (gluonnlp's attention cells). Each override defined in the module, by a class
derived from the callee's class there, with ``F`` at the same position, receives ``F`` as
the callee does (hybrid.py follows it)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import libcst as cst


class Definition(Protocol):
    """hybrid.py's record of a function that takes ``F``."""

    node: cst.FunctionDef
    cls: cst.ClassDef | None
    index: int


D = TypeVar("D", bound=Definition)


def _base_names(cls: cst.ClassDef) -> list[str]:
    return [b.value.value for b in cls.bases if isinstance(b.value, cst.Name)]


def _derived(root: str, classes: Iterable[cst.ClassDef]) -> set[str]:
    """The names of the classes derived, directly or not, from the class ``root``."""
    found: set[str] = set()
    grew = True
    while grew:
        grew = False
        for cls in classes:
            name = cls.name.value
            if name not in found and any(b == root or b in found for b in _base_names(cls)):
                found.add(name)
                grew = True
    return found


def _classes(module: cst.Module) -> list[cst.ClassDef]:
    found: list[cst.ClassDef] = []

    class Finder(cst.CSTVisitor):
        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            found.append(node)

    module.visit(Finder())
    return found


def overrides(call: cst.Call, callee: D, every: Sequence[D], module: cst.Module) -> list[D]:
    """The overrides of ``callee`` a ``self.name(F, ...)`` ``call`` also reaches: methods
    of the same name, ``F`` at the same position, in classes derived from its class."""
    func = call.func
    receiver = func.value if isinstance(func, cst.Attribute) else None
    if not (isinstance(receiver, cst.Name) and receiver.value == "self") or callee.cls is None:
        return []
    derived = _derived(callee.cls.name.value, _classes(module))
    name = callee.node.name.value
    return [
        d for d in every
        if d.cls is not None and d.cls.name.value in derived and d.node.name.value == name
        and d.index == callee.index
    ]  # fmt: skip
