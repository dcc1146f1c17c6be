"""In-place updates by a gradient (``param[:] = param - lr * param.grad``, ``w -= lr *
w.grad``): the source does them outside recording, PyTorch refuses them on a leaf that
needs a gradient unless no gradient is recorded, so the statement goes into the table's
context (``with torch.no_grad():``, a table's ``grad_update``)."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from polytrain.porting.code.arguments import code
from polytrain.porting.code.port_pass import PortPass


def grad_update(port: PortPass, stmt: cst.CSTNode) -> bool:
    """``param[:] = param - lr * param.grad`` or ``w -= lr * w.grad``: an array updated
    in place by a gradient, which the source does outside recording and PyTorch
    refuses on a leaf that needs a gradient unless no gradient is recorded."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    if not any(fw.grad_update for fw in port.imported):
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target, value = small.targets[0].target, small.value
        in_place = isinstance(target, cst.Subscript)
    elif isinstance(small, cst.AugAssign):
        target, value = small.target, small.value
        in_place = isinstance(target, cst.Subscript | cst.Name)
    else:
        return False
    return in_place and ".grad" in code(value) and not _in_with(port, stmt)


def _in_with(port: PortPass, node: cst.CSTNode) -> bool:
    """``node`` is inside a ``with`` block of its function (``autograd.record()``
    records there)."""
    current = port.get_metadata(ParentNodeProvider, node, None)
    while current is not None:
        if isinstance(current, cst.With):
            return True
        if isinstance(current, cst.FunctionDef | cst.ClassDef):
            return False
        current = port.get_metadata(ParentNodeProvider, current, None)
    return False


def unrecorded(port: PortPass, stmt: cst.SimpleStatementLine) -> cst.With:
    """``stmt`` in the table's context (``with torch.no_grad():``)."""
    context = next(fw.grad_update for fw in port.imported if fw.grad_update)
    port.roots_named(context)
    inner = stmt.with_changes(leading_lines=[])
    return cst.With(
        items=[cst.WithItem(cst.parse_expression(context))],
        body=cst.IndentedBlock(body=[inner]),
        leading_lines=stmt.leading_lines,
    )
