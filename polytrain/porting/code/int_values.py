"""Expressions that are an int whatever the program's values: a subscript of a ``.shape``
(an int in every framework and in numpy) and ``len(...)``. A ``target_by`` key ``<int>``
takes them as it takes an int literal (``paddle.split(x, x.shape[-1])``: that many equal
parts, torch.chunk)."""

from __future__ import annotations

import libcst as cst


def is_int_valued(expr: cst.BaseExpression) -> bool:
    """``expr`` is ``<anything>.shape[<one index>]`` or ``len(<one argument>)``."""
    if isinstance(expr, cst.Subscript):
        one = len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index)
        value = expr.value
        return one and isinstance(value, cst.Attribute) and value.attr.value == "shape"
    if isinstance(expr, cst.Call):
        func = expr.func
        return isinstance(func, cst.Name) and func.value == "len" and len(expr.args) == 1
    return False
