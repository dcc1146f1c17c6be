"""Rules that act on whole statements: a statement the last pass failed on is left as it
was under a marker; the call of a ``remove`` entry takes its statement away; a
``context`` entry's ``with`` is flattened into its body; a method entry's ``then`` adds a
statement after its own; an in-place update by a gradient goes under the table's context
(grad_updates.py); the markers of the uses left in a statement are written above it."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
from libcst.metadata import ParentNodeProvider

from polytrain.porting.code import grad_updates
from polytrain.porting.code.arguments import NotConverted, convert_arguments
from polytrain.porting.code.port_pass import MARKER, STATEMENT, PortPass, Statement
from polytrain.porting.code.report import Use
from polytrain.porting.code.table import Entry

FAILED = "the tool failed on this statement ({error}); it is left as it was"
Left = cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]


def entered(port: PortPass, node: cst.CSTNode) -> bool:
    """A statement the last pass failed on (``skip``) is not entered: it stays as it
    was, under a marker; the others are tracked so a failure can name its statement."""
    if isinstance(node, Statement):
        at = port.position(node)
        error = port.skip.get(at)
        if error is not None:
            why = FAILED.format(error=error)
            port.uses.append(Use(at[0], STATEMENT, why))
            port.markers.setdefault(node, []).append(MARKER.format(api=STATEMENT, why=why))
            return False
        port.inside.append(at)
    return True


def left_whole(port: PortPass, original: cst.CSTNode) -> None:
    """``original`` is no longer being visited, once left without an error."""
    if isinstance(original, Statement) and port.inside:
        at = port.position(original)
        if port.inside[-1] == at:  # popped only once left without an error
            port.inside.pop()


def converted(port: PortPass, original: cst.CSTNode, result: Left) -> Left:
    """``result``, the node ``original`` was converted into, with the edits of its
    statement: removed, under the table's no-grad context, a statement added after it,
    its markers above it; what each statement was made into is recorded (``made``)."""
    if original in port.removed:
        return cst.RemoveFromParent()
    if isinstance(result, cst.SimpleStatementLine) and grad_updates.grad_update(port, original):
        result = grad_updates.unrecorded(port, result)
    then = port.then.pop(original, None)
    if then is not None and isinstance(result, cst.SimpleStatementLine):
        added = cst.parse_statement(then)
        result = cst.FlattenSentinel([result, added])
        port.made[original] = list(result.nodes)
        return result
    markers = port.markers.pop(original, None)
    if markers and isinstance(result, Statement):
        known = {line.comment.value for line in result.leading_lines if line.comment}
        fresh = [m for m in dict.fromkeys(markers) if m not in known]
        result = result.with_changes(leading_lines=[*result.leading_lines, *_comments(fresh)])
    if isinstance(original, Statement):
        made = result.nodes if isinstance(result, cst.FlattenSentinel) else [result]
        port.made[original] = [n for n in made if isinstance(n, cst.CSTNode)]
    return result


def removed_call(
    port: PortPass, original: cst.Call, updated: cst.Call, entry: Entry, api: str
) -> cst.BaseExpression:
    """The statement that is only this call goes (its arguments must all drop)."""
    expr = port.get_metadata(ParentNodeProvider, original)
    stmt = port.get_metadata(ParentNodeProvider, expr) if isinstance(expr, cst.Expr) else None
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        port.left(original, api, "removed only as a statement of its own")
        return updated
    try:
        convert_arguments(entry, updated.args, api)
    except NotConverted as exc:
        port.left(original, api, str(exc))
        return updated
    port.removed.add(stmt)
    port.done(original, api)
    return updated


def context_call(
    port: PortPass, original: cst.Call, updated: cst.Call, api: str
) -> cst.BaseExpression:
    """``with <api>(...):`` whose target is nothing to enter: the body stays, unindented."""
    item = port.get_metadata(ParentNodeProvider, original)
    stmt = None
    if isinstance(item, cst.WithItem) and item.asname is None:
        stmt = port.get_metadata(ParentNodeProvider, item)
    ok = (
        isinstance(stmt, cst.With)
        and len(stmt.items) == 1
        and isinstance(stmt.body, cst.IndentedBlock)
    )
    if not ok:
        port.left(original, api, "removed only as the one item of `with ...:` on its own")
        return updated
    assert stmt is not None
    port.flatten.add(stmt)
    port.done(original, api)
    return updated


def flattened_with(
    port: PortPass, original: cst.With, updated: cst.With
) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
    """A ``with`` of a ``context`` entry (``context_call``) as its body, its comments and
    markers above the body's first statement."""
    if original not in port.flatten:
        return updated
    assert isinstance(updated.body, cst.IndentedBlock)
    body = list(updated.body.body)
    markers = port.markers.pop(original, [])
    head = [*updated.leading_lines, *_comments(markers)]
    first = body[0] if body else None
    if head and isinstance(first, Statement):
        body[0] = first.with_changes(leading_lines=[*head, *first.leading_lines])
    return cst.FlattenSentinel(body)


def _comments(texts: Iterable[str]) -> list[cst.EmptyLine]:
    """One comment line for each of ``texts`` (the first of those repeated)."""
    return [cst.EmptyLine(indent=True, comment=cst.Comment(t)) for t in dict.fromkeys(texts)]
