"""``self`` in a method of a layer class: a class whose bases are one of a table's
``layer_classes`` (Paddle's ``nn.Layer``, ``nn.Sequential``...), or a class of the same
module derived from one. A method entry with ``receivers`` naming the framework's first
layer class (``self.create_parameter(...)``) is converted on that ``self``; in a class
whose bases the tool does not see (imported from the model's own package) it is marked."""

from __future__ import annotations

from collections.abc import Callable, Collection

import libcst as cst

Resolve = Callable[[cst.BaseExpression], str | None]  # a base's qualified framework name
Parent = Callable[[cst.CSTNode], cst.CSTNode | None]
_NOT_SELF = ("staticmethod", "classmethod")


class _Classes(cst.CSTVisitor):
    """Every class definition, by name, and the methods defined directly in each."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[cst.ClassDef]] = {}
        self.methods: dict[cst.ClassDef, list[cst.FunctionDef]] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.by_name.setdefault(node.name.value, []).append(node)
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
        self.methods[node] = [f for f in body if isinstance(f, cst.FunctionDef)]


def layer_classes(
    module: cst.Module, resolve: Resolve, bases: Collection[str]
) -> set[cst.ClassDef]:
    """The module's classes derived from one of ``bases``, directly or through classes of
    the module (``class Block(nn.Layer)``, ``class Net(Block)``)."""
    found = _Classes()
    module.visit(found)
    layers: set[cst.ClassDef] = set()
    changed = True
    while changed:
        changed = False
        for node in found.methods:
            if node not in layers and any(
                _is_layer(b.value, resolve, bases, found.by_name, layers) for b in node.bases
            ):
                layers.add(node)
                changed = True
    return layers


def _is_layer(
    base: cst.BaseExpression,
    resolve: Resolve,
    bases: Collection[str],
    by_name: dict[str, list[cst.ClassDef]],
    layers: set[cst.ClassDef],
) -> bool:
    name = resolve(base)
    if name is not None:
        return name in bases
    local = by_name.get(base.value, []) if isinstance(base, cst.Name) else []
    return bool(local) and all(c in layers for c in local)


def enclosing_method(
    node: cst.CSTNode, parent: Parent
) -> tuple[cst.FunctionDef, cst.ClassDef] | None:
    """The function ``node`` is directly in (not in a lambda or a function nested in it)
    and its class, where it is defined in a class body; None elsewhere."""
    current = parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Lambda):
        current = parent(current)
    if not isinstance(current, cst.FunctionDef):
        return None
    block = parent(current)
    cls = parent(block) if isinstance(block, cst.IndentedBlock) else None
    return (current, cls) if isinstance(cls, cst.ClassDef) else None


def self_of_layer(name: cst.Name, parent: Parent, layers: set[cst.ClassDef]) -> bool:
    """``name`` is the first parameter of the method (not a static or class method) of a
    layer class that it is used in, directly (not in a function nested in the method)."""
    method = enclosing_method(name, parent)
    if method is None:
        return False
    func, cls = method
    params = func.params.params
    if not params or params[0].name.value != name.value or _decorated(func):
        return False
    return cls in layers


def _decorated(func: cst.FunctionDef) -> bool:
    names = {d.decorator.value for d in func.decorators if isinstance(d.decorator, cst.Name)}
    return bool(names & set(_NOT_SELF))
