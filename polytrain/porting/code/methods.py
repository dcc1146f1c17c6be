"""Method calls converted by the tables' method entries (``loss.backward()``,
``x.astype('float32')``, ``opt.clear_grad()``): on the receivers an entry names (what made
the object: receivers.py), with a step's ``1 / n`` moved onto its backward (pairing.py),
the receiver put where the entry's target chain has it; and ``a.parameters() +
b.parameters()``, lists in the source, iterators in PyTorch."""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst

from polytrain.porting.code import gluon_loops, receivers, statements
from polytrain.porting.code.arguments import Converted, NotConverted, code, convert_arguments
from polytrain.porting.code.port_pass import FOREIGN, PortPass
from polytrain.porting.code.table import Entry

_RECEIVER = "__polytrain_receiver__"


def convert_method(
    port: PortPass, original: cst.Call, updated: cst.Call, entry: Entry
) -> cst.BaseExpression:
    """``<receiver>.<method>(...)`` by its method ``entry``, or left (marked where the
    entry says why)."""
    api = entry.source
    assert isinstance(original.func, cst.Attribute) and isinstance(updated.func, cst.Attribute)
    if entry.receivers and not _on_receiver(port, original, entry):
        return updated
    if entry.unsupported:
        port.left(original, api, entry.unsupported)
        return updated
    if entry.kind == "context":
        return statements.context_call(port, original, updated, api)
    if entry.kind == "remove":
        return statements.removed_call(port, original, updated, entry, api)
    unpaired = bool(entry.needs_pair) and original not in port.pairs.divisor
    if unpaired and not entry.unpaired:
        port.left(original, api, entry.needs_pair)
        return updated
    receiver = _through(original, updated, entry.through)
    try:
        converted = convert_arguments(entry, updated.args, api, code(receiver).strip())
    except NotConverted as exc:
        port.left(original, api, str(exc))
        return updated
    if entry.kind == "expression":
        return method_expression(port, original, api, converted.target, converted.imports)
    return _rewritten(port, original, updated, entry, receiver, converted, unpaired)


def _on_receiver(port: PortPass, original: cst.Call, entry: Entry) -> bool:
    """The call's receiver is one that ``entry`` converts (made by one of its
    ``receivers``, or filled with blocks); else False, marked where the entry says why."""
    assert isinstance(original.func, cst.Attribute)
    made_by = receivers.receiver_api(port, original.func.value)
    if made_by not in entry.receivers and original not in port.filled:
        if entry.unknown_receiver and made_by != FOREIGN:
            port.left(original, entry.source, entry.unknown_receiver)
        return False
    return True


def _rewritten(
    port: PortPass,
    original: cst.Call,
    updated: cst.Call,
    entry: Entry,
    receiver: cst.BaseExpression,
    converted: Converted,
    unpaired: bool,
) -> cst.BaseExpression:
    """The method call with its ``converted`` arguments: a scaled step as
    ``gluon_step``, a step whose ``1 / n`` moved, a backward divided by it (through the
    table's helper when unpaired or shared), else the entry's target chain on ``receiver``."""
    api = entry.source
    assert isinstance(updated.func, cst.Attribute)
    stepper = next((f for f in port.imported if gluon_loops.STEP_HELPER in f.helpers), None)
    if converted.moved and original in port.pairs.scaled and stepper is not None:
        port.helper(stepper, gluon_loops.STEP_HELPER)  # gluon_loops.py
        port.done(original, api)
        return gluon_loops.step_call(receiver, port.pairs.scaled[original])
    if converted.moved and original not in port.pairs.paired:
        why = next(a.why for a in entry.args if a.moves)
        port.left(original, api, why)
        return updated
    divisor = port.pairs.divisor.get(original)
    if divisor is not None and not _is_one(divisor):
        receiver = cst.parse_expression(f"({code(receiver)} / {code(divisor)})")
    if unpaired or receivers.shared(port, original):  # ``gluon_backward(loss)``: the helper
        helper = entry.unpaired
        port.helper(next(f for f in port.imported if helper in f.helpers), helper)
        port.done(original, api)
        return cst.Call(cst.Name(helper), [cst.Arg(receiver), *converted.args])
    chain = cst.parse_expression(_RECEIVER + converted.target)
    func = chain.visit(_Receiver(receiver))
    port.done(original, api)
    port.roots_named("".join(code(a) for a in converted.args))
    if entry.then:
        port.then[port.statement(original)] = code(updated.func.value) + entry.then + "()"
    assert isinstance(func, cst.BaseExpression)
    return updated.with_changes(func=func, args=converted.args)


def method_expression(
    port: PortPass, original: cst.CSTNode, api: str, text: str, imports: set[str]
) -> cst.BaseExpression:
    """A method call replaced by its entry's expression (``$self`` filled in)."""
    port.done(original, api)
    port.needs_root.update(imports)
    port.roots_named(text)
    for fw in port.imported:
        port.helpers_named(fw, text)
    return cst.parse_expression(text)


def listed_sum(port: PortPass, updated: cst.BinaryOperation) -> cst.BaseExpression:
    """``a.parameters() + b.parameters()``: lists in the source, iterators in PyTorch."""
    if not isinstance(updated.operator, cst.Add):
        return updated
    names = {m.lstrip(".") for fw in port.imported for m in fw.list_methods}
    listed = [_call_of(side, names) for side in (updated.left, updated.right)]
    if not any(listed):
        return updated
    left, right = (
        cst.Call(cst.Name("list"), [cst.Arg(side)]) if wrap else side
        for side, wrap in zip((updated.left, updated.right), listed, strict=True)
    )
    return updated.with_changes(left=left, right=right)


def _through(original: cst.Call, updated: cst.Call, method: str) -> cst.BaseExpression:
    """The receiver a method is converted on: ``net`` where the call is
    ``net.<method>().<this>(...)`` and the entry goes ``through`` that method, else the
    call's own receiver."""
    assert isinstance(updated.func, cst.Attribute) and isinstance(original.func, cst.Attribute)
    inner = updated.func.value
    if (
        method
        and _call_of(original.func.value, {method.lstrip(".")})
        and isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Attribute)
    ):
        return inner.func.value
    return inner


def _call_of(node: cst.BaseExpression, methods: Collection[str]) -> bool:
    """``node`` is ``<x>.<one of methods>()``."""
    return (
        isinstance(node, cst.Call)
        and not node.args
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in methods
    )


def _is_one(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.value == "1"


class _Receiver(cst.CSTTransformer):
    """Puts a method call's receiver where the table's target chain has its placeholder."""

    def __init__(self, receiver: cst.BaseExpression) -> None:
        super().__init__()
        self.receiver = receiver

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.receiver if updated.value == _RECEIVER else updated
