"""``paddle.get_default_dtype()``: a dtype's name in Paddle (``'float32'``), a
``torch.dtype`` in PyTorch; no one value is both. As a framework call's ``dtype=`` or
``paddle.cast``'s dtype it is ``torch.get_default_dtype()``, as ``.astype(...)``'s its
name, and its name too where it is compared with names (``== 'float32'``, ``in ('float16',
'bfloat16')``); elsewhere (printed, passed to the code's own function) it is marked.
Names are built from the table's roots (the core names no framework)."""

from __future__ import annotations

import libcst as cst

from polytrain.porting.code.table import Framework

FUNCTION = "get_default_dtype"
WHY = (
    "a dtype's name in Paddle ('float32'), a torch.dtype in PyTorch: converted only as a "
    "framework call's dtype; where it is compared or printed, write torch.get_default_dtype() "
    "and compare with torch.float32"
)


def is_default_dtype(api: str, fw: Framework) -> bool:
    """``api`` is the framework's ``get_default_dtype``."""
    return api == f"{fw.root}.{FUNCTION}"


def converted(
    arg: cst.CSTNode | None, call: cst.CSTNode | None, api: str | None, fw: Framework
) -> str | None:
    """The code for the value where ``arg`` is the dtype of ``call`` (``api``: the framework
    API it calls, else None): the torch dtype as a framework call's ``dtype=`` or
    ``paddle.cast(x, arg)``'s, the name (as Paddle's) as ``x.astype(arg)``'s, which a
    tensor (tensor_astype) and a numpy array both take; None elsewhere."""
    if not isinstance(arg, cst.Arg) or not isinstance(call, cst.Call):
        return None
    dtype = f"{fw.target_root}.{FUNCTION}()"
    keyword = arg.keyword.value if arg.keyword is not None else None
    at = next(i for i, a in enumerate(call.args) if a is arg)
    if (keyword == "dtype" and api is not None) or (api == f"{fw.root}.cast" and at == 1):
        return dtype
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "astype" and api is None:
        name = f"str({dtype}).replace('{fw.target_root}.', '')"  # 'float32', as Paddle's
        return name if at == 0 and keyword is None else None
    return None


def _names(node: cst.BaseExpression) -> bool:
    """A string literal, or a list, tuple or set display of them."""
    if isinstance(node, cst.List | cst.Tuple | cst.Set):
        return bool(node.elements) and all(_names(e.value) for e in node.elements)
    return isinstance(node, cst.SimpleString)


def compared(
    node: cst.Call, parent: cst.CSTNode | None, grandparent: cst.CSTNode | None, fw: Framework
) -> str | None:
    """The dtype's name, as Paddle's, where ``node`` is compared (``==``, ``!=``, ``in``,
    ``not in``) with string literals only; None elsewhere."""
    comparison = parent if isinstance(parent, cst.Comparison) else grandparent
    if not isinstance(comparison, cst.Comparison):
        return None
    if parent is not comparison and not isinstance(parent, cst.ComparisonTarget):
        return None
    ops = (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)
    others = [comparison.left, *(t.comparator for t in comparison.comparisons)]
    if not all(isinstance(t.operator, ops) for t in comparison.comparisons):
        return None
    if not all(o is node or _names(o) for o in others):
        return None
    return f"str({fw.target_root}.{FUNCTION}()).replace('{fw.target_root}.', '')"
