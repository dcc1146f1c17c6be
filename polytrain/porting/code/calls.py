"""Framework calls converted by the mapping tables: a call of a framework API by its entry
(its arguments by arguments.py, a layer wrapped, initialised or passed to an ``around``
helper, a scheduler built on its optimizer), a call of an object a framework call made
(its entry's ``called``), Gluon's ``F.x(...)`` that no table converts, and method calls
handed to methods.py; or the call left in place under a marker saying why."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import libcst as cst
from libcst.metadata import ParentNodeProvider

from polytrain.porting.code import (
    array_functions,
    default_dtype,
    gluon_loops,
    methods,
    pairing,
    receivers,
    statements,
    weight_layout,
)
from polytrain.porting.code.arguments import NO_SPACE, NotConverted, code, convert_arguments
from polytrain.porting.code.port_pass import NOT_IN_TABLE, PortPass, Resolved
from polytrain.porting.code.table import Entry, Framework

SCHEDULER_ALONE = (
    "a scheduler is converted when an optimizer is made from it in the same block, after "
    "it (`opt = paddle.optimizer.X(learning_rate=sched, ...)`): PyTorch builds it on the "
    "optimizer"
)
HYBRID_F = (
    "`F` is the module mxnet.nd or mxnet.sym that Gluon passes to `hybrid_forward(self, F, "
    "...)`, not a tensor: write `forward(self, ...)` without `F` and call torch's function"
)
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
_ATOMS = (
    cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.ConcatenatedString,
    cst.FormattedString, cst.Integer, cst.Float, cst.Imaginary, cst.List, cst.Dict, cst.Set,
    cst.ListComp, cst.DictComp, cst.SetComp, cst.GeneratorExp, cst.Ellipsis,
)  # fmt: skip
_LOOSE = (
    cst.Arg, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Expr, cst.Element,
    cst.DictElement, cst.WithItem, cst.Yield,
)  # fmt: skip  # places where an operation needs no parentheses


def converted_call(port: PortPass, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """The call converted by whichever rule it falls under, else as it is."""
    named = isinstance(original.func, cst.Name | cst.Attribute)
    found = port.resolved(original.func) if named else None
    if found is not None:
        return _convert_call(port, original, updated, found)
    made = receivers.made_entry(port, original.func) if named and not original.args else None
    if made is not None and made.called:
        port.done(original, f"{made.source}()")
        return cst.parse_expression(made.called.replace("$self", code(updated.func)))
    if isinstance(original.func, cst.Attribute) and _hybrid_f(port, original.func.value):
        port.left(original, f"F.{original.func.attr.value}", HYBRID_F)
        return updated
    if isinstance(original.func, cst.Attribute) and not _elsewhere(port, original.func.value):
        entry = port.method_entry(original.func.attr.value)
        if entry is not None and entry.kind != "attribute":
            return methods.convert_method(port, original, updated, entry)
    return updated


def grouped(port: PortPass, original: cst.Call, made: cst.BaseExpression) -> cst.BaseExpression:
    """``made`` in parentheses where it is an operation (an expression entry's ``a * b``,
    ``lambda w: ...``) whose place binds tighter: called, an attribute's or a
    subscript's value, an operand."""
    if made.lpar or isinstance(made, _ATOMS):
        return made
    parent = port.get_metadata(ParentNodeProvider, original, None)
    if isinstance(parent, _LOOSE) or parent is None:
        return made
    return made.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _elsewhere(port: PortPass, receiver: cst.BaseExpression) -> bool:
    """``receiver`` is another module's (``foreign``) or a result of that module's call
    (``np.ones(3).astype``: a chain of calls from it)."""
    while isinstance(receiver, cst.Call | cst.Attribute | cst.Subscript):
        receiver = receiver.func if isinstance(receiver, cst.Call) else receiver.value
        if port.foreign(receiver):
            return True
    if isinstance(receiver, cst.Name) and receiver.value in port.itself:
        return True  # ``d2l.exp(x)``: the file's own function
    return port.foreign(receiver)


def _hybrid_f(port: PortPass, receiver: cst.BaseExpression) -> bool:
    """``receiver`` is a parameter that a table names as its framework's module (Gluon's
    ``F``: the mxnet.nd or mxnet.sym a HybridBlock's ``hybrid_forward(self, F, ...)`` is
    given and passes on) of the function it is used in; ``F.softmax(x)`` is a function
    of it, not a tensor's method."""
    names = {fw.module_parameter for fw in port.imported} - {""}
    if not isinstance(receiver, cst.Name) or receiver.value not in names:
        return False
    current = port.get_metadata(ParentNodeProvider, receiver, None)
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = port.get_metadata(ParentNodeProvider, current, None)
    params = current.params.params if current is not None else ()
    return any(p.name.value == receiver.value for p in params)


def _unsupported_call(
    port: PortPass, original: cst.Call, updated: cst.Call, api: str, why: str
) -> cst.BaseExpression:
    """A call the table marks, unless a rule of gluon_loops.py converts it here."""
    predict = None
    if api.endswith(gluon_loops.PREDICT_MODE):
        predict = gluon_loops.predict_mode(original, port.parent)
    if predict is not None:
        port.done(original, api)
        port.full(gluon_loops.PREDICT_HELPER)
        return predict
    port.left(original, api, why)
    return updated


def _convert_call(
    port: PortPass, original: cst.Call, updated: cst.Call, found: Resolved
) -> cst.BaseExpression:
    entry = found.framework.entries.get(found.name)
    api = found.name
    if default_dtype.is_default_dtype(api, found.framework):
        return _default_dtype(port, original, updated, found)
    if entry is None:
        port.left(original, api, found.framework.why_not(api) or NOT_IN_TABLE)
        return updated
    layer_api = partial(receivers.layer_api, port)
    layout = weight_layout.why_not(api, original, layer_api, found.framework)
    if entry.unsupported or layout:  # layout: a dim of a weight laid out otherwise
        return _unsupported_call(port, original, updated, api, entry.unsupported or layout)
    if entry.kind == "context":
        return statements.context_call(port, original, updated, api)
    if entry.kind == "remove":
        return statements.removed_call(port, original, updated, entry, api)
    if entry.kind == "reference":
        port.done(original, api)
        return updated.with_changes(func=port.target_expr(original.func, entry.target))
    if entry.kind == "scheduler" and original not in port.pairs.scheduler_of:
        port.left(original, api, SCHEDULER_ALONE)
        return updated
    return _with_arguments(port, original, updated, found, entry)


def _with_arguments(
    port: PortPass, original: cst.Call, updated: cst.Call, found: Resolved, entry: Entry
) -> cst.BaseExpression:
    """The call by ``entry`` with its arguments converted: the target called, or the
    entry's expression; the made object initialised, passed to its ``around`` helpers and
    wrapped; a scheduler given its optimizer. Left marked where an argument cannot be."""
    api = found.name
    args = updated.args
    if original in port.pairs.lr_of:
        args = pairing.with_argument(args, entry, "learning_rate", port.pairs.lr_of[original])
    args = array_functions.numpy_dtypes(entry, original.args, args, port.names_of)
    in_block = array_functions.in_block_method(original, port.parent, port.gluon_blocks)
    args = array_functions.with_mode(entry, args, in_block)
    try:
        converted = convert_arguments(entry, args, api)
    except NotConverted as exc:
        port.left(original, api, str(exc))
        return updated
    port.needs_root.update(converted.imports)
    if entry.kind == "expression":
        port.done(original, api)
        made = port.table_code(found.framework, converted.target)
        if converted.inits:
            return _initialised(port, found.framework, made, converted.inits)
        return _around(port, found.framework, made, converted.arounds)
    new_args = converted.args
    if original in port.pairs.scheduler_of:
        first = cst.Arg(cst.Name(port.pairs.scheduler_of[original]))
        new_args = [first.with_changes(comma=_COMMA) if new_args else first, *new_args]
    call: cst.BaseExpression = updated.with_changes(
        func=port.target_expr(original.func, converted.target), args=new_args
    )
    port.helpers_named(found.framework, code(call))  # an argument's template's helper
    if entry.result:  # the output's shape, as the source's (table.Entry.result)
        call = cst.parse_expression(code(call) + entry.result)
    if converted.inits:  # ``init_parameters(layer, weight=...)``: the table's helper
        call = _initialised(port, found.framework, call, converted.inits)
    call = _around(port, found.framework, call, converted.arounds)
    port.done(original, api)
    return _wrapped(port, found.framework, call, converted.wraps, converted.before)


def _default_dtype(
    port: PortPass, original: cst.Call, updated: cst.Call, found: Resolved
) -> cst.BaseExpression:
    """``paddle.get_default_dtype()`` where it is a dtype argument (default_dtype.py)."""
    arg = port.parent(original)
    call = port.parent(arg) if arg is not None else None
    func = call.func if isinstance(call, cst.Call) else None
    owner = port.resolved(func) if isinstance(func, cst.Name | cst.Attribute) else None
    target = default_dtype.converted(arg, call, owner.name if owner else None, found.framework)
    target = target or default_dtype.compared(original, arg, call, found.framework)
    if target is None:
        port.left(original, found.name, default_dtype.WHY)
        return updated
    port.done(original, found.name)
    return port.table_code(found.framework, target)


def _around(
    port: PortPass, fw: Framework, call: cst.BaseExpression, arounds: Sequence[tuple[str, str]]
) -> cst.BaseExpression:
    """The made object passed to each ``around`` helper with its argument's value
    (``with_grad_clip(optimizer, clip)``)."""
    for helper, value in arounds:
        made = [cst.Arg(call), cst.Arg(cst.parse_expression(value))]
        call = cst.Call(port.table_code(fw, helper), made)
    return call


def _initialised(
    port: PortPass, fw: Framework, call: cst.BaseExpression, inits: Sequence[tuple[str, str]]
) -> cst.BaseExpression:
    """The made layer passed to the framework's init helper with its initializers."""
    values = [
        cst.Arg(port.table_code(fw, v), keyword=cst.Name(k), equal=NO_SPACE) for k, v in inits
    ]
    return cst.Call(port.table_code(fw, fw.init_helper), [cst.Arg(call), *values])


def _wrapped(
    port: PortPass,
    fw: Framework,
    call: cst.BaseExpression,
    wraps: Sequence[str],
    before: Sequence[str] = (),
) -> cst.BaseExpression:
    """The made layer in the framework's sequential, between the table's layers that go
    ``before`` it and those that ``wrap`` it (a Dense's flatten, its activation)."""
    if not wraps and not before:
        return call
    first = [cst.Arg(port.table_code(fw, w)) for w in before]
    layers = [cst.Arg(port.table_code(fw, w)) for w in wraps]
    args = [*first, cst.Arg(call), *layers]
    return cst.Call(func=port.table_code(fw, fw.sequential), args=args)
