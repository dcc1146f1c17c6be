"""Reads of a weight whose layout is the PyTorch layer's transpose (Paddle's Linear: [in,
out]; PyTorch's: [out, in]) that the tool can convert: an argument of a product (its
``.mT``, a view that is the source's tensor: a product of it is the source's), and a
value reduced to a number whatever the layout (``w.numpy().item()``, ``w.sum()``, through
methods that keep the layout). Any other read (an initializer, a copy, a slice) stays
marked. Names are built from the table's roots (the core names no framework)."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

PRODUCTS = ("matmul", "mm", "nn.functional.linear")  # under the framework's root
KEEP_LAYOUT = frozenset({"numpy", "detach", "cpu", "cuda", "clone", "abs", "square"})
REDUCED = frozenset({"item", "sum", "mean", "max", "min", "numel", "norm"})  # no arguments

Parent = Callable[[cst.CSTNode], cst.CSTNode | None]


def _no_argument_call(node: cst.CSTNode, parent: Parent) -> tuple[str, cst.Call] | None:
    """``node.name()``: the method's name and the call."""
    attr = parent(node)
    if not isinstance(attr, cst.Attribute) or attr.value is not node:
        return None
    call = parent(attr)
    if isinstance(call, cst.Call) and call.func is attr and not call.args:
        return attr.attr.value, call
    return None


def reduced(node: cst.BaseExpression, parent: Parent) -> bool:
    """``node`` reduced to a number through methods that keep its layout."""
    current: cst.CSTNode = node
    while (method := _no_argument_call(current, parent)) is not None:
        name, call = method
        if name in REDUCED:
            return True
        if name not in KEEP_LAYOUT:
            return False
        current = call
    return False


def in_product(
    node: cst.BaseExpression,
    parent: Parent,
    qualified: Callable[[cst.BaseExpression], str | None],
    root: str,
) -> bool:
    """``node`` is an argument of one of the framework's products."""
    arg = parent(node)
    call = parent(arg) if isinstance(arg, cst.Arg) else None
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name | cst.Attribute):
        return False
    return qualified(call.func) in {f"{root}.{p}" for p in PRODUCTS}
