"""Statements paired within a block, whose PyTorch form depends on each other.

A scheduler made before the optimizer made from it (``sched = X(learning_rate=LR)``,
``opt = Y(learning_rate=sched)``): PyTorch builds the scheduler on the optimizer, so the
optimizer takes LR and the scheduler's statement moves after it. A ``trainer.step(n)``
after ``loss.backward()``: the ``1 / n`` moves onto the backward (gluon_loops.py where
that backward is not a statement of its own). Found when a block is visited (``Pairs``),
used when its calls are converted, the statements moved when it is left (``moved``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst

from polytrain.porting.code import gluon_loops
from polytrain.porting.code.arguments import code
from polytrain.porting.code.table import Entry

EntryNamed = Callable[[cst.BaseExpression], Entry | None]  # a framework API's table entry
MethodEntry = Callable[[str], Entry | None]  # a method name's entry in the tables in use


@dataclass
class Pairs:
    """What the blocks of one module pair, by the calls involved."""

    scheduler_of: dict[cst.CSTNode, str] = field(default_factory=dict)  # sched -> opt name
    lr_of: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)  # opt -> lr
    moves: dict[cst.CSTNode, list[tuple[cst.CSTNode, cst.CSTNode]]] = field(
        default_factory=dict
    )  # block -> (scheduler statement, optimizer statement)
    divisor: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)  # bwd -> n
    paired: set[cst.CSTNode] = field(default_factory=set)  # step calls whose argument moved
    scaled: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)  # gluon_step
    stepped_by: dict[cst.CSTNode, tuple[str, ...]] = field(default_factory=dict)  # step makers


# -- schedulers -------------------------------------------------------------------------


def _assigned_call(
    stmt: cst.CSTNode, entry_named: EntryNamed
) -> tuple[str, cst.Call, Entry] | None:
    """``name = <framework call>`` on a line of its own: (name, call, entry)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and isinstance(small.value, cst.Call)
    ):
        return None
    entry = entry_named(small.value.func)
    if entry is None:
        return None
    return small.targets[0].target.value, small.value, entry


def pair_schedulers(
    pairs: Pairs, block: cst.CSTNode, body: Sequence[cst.CSTNode], entry_named: EntryNamed
) -> None:
    """``sched = <scheduler>(learning_rate=LR, ...)`` followed in the same block by
    ``opt = <optimizer>(learning_rate=sched, ...)``: PyTorch builds the scheduler on the
    optimizer, so the optimizer takes LR and the scheduler moves after it."""
    pending: dict[str, tuple[cst.CSTNode, cst.Call, Entry]] = {}
    for stmt in body:
        found = _assigned_call(stmt, entry_named)
        if found is not None and found[2].kind == "scheduler":
            pending[found[0]] = (stmt, found[1], found[2])
            continue
        if found is None or not pending:
            continue
        name, call, entry = found
        lr_arg = argument(call, entry, "learning_rate")
        if lr_arg is None or not isinstance(lr_arg.value, cst.Name):
            continue
        sched = pending.pop(lr_arg.value.value, None)
        if sched is None:
            continue
        sched_stmt, sched_call, sched_entry = sched
        lr = _scheduler_lr(sched_call, sched_entry)
        if lr is None:
            continue
        pairs.scheduler_of[sched_call] = name
        pairs.lr_of[call] = lr
        pairs.moves.setdefault(block, []).append((sched_stmt, stmt))


def moved(
    pairs: Pairs,
    original: cst.CSTNode,
    body: Sequence[cst.BaseStatement],
    made: Mapping[cst.CSTNode, list[cst.CSTNode]],
) -> list:
    """The block's converted ``body`` with each paired scheduler's statement after its
    optimizer's (``made``: each original statement -> what it was converted into)."""
    out = list(body)
    for sched_stmt, opt_stmt in pairs.moves.get(original, []):
        made_s, made_o = made.get(sched_stmt, []), made.get(opt_stmt, [])
        if len(made_s) != 1 or len(made_o) != 1:
            continue
        try:
            i = next(k for k, n in enumerate(out) if n is made_s[0])
            j = next(k for k, n in enumerate(out) if n is made_o[0])
        except StopIteration:
            continue
        moving = out.pop(i)
        j = j - 1 if j > i else j
        out.insert(j + 1, moving)
    return out


def argument(call: cst.Call, entry: Entry, name: str) -> cst.Arg | None:
    """The argument of ``call`` bound to the source parameter ``name``."""
    index = next((i for i, a in enumerate(entry.args) if a.name == name), None)
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
        if arg.keyword is None and not arg.star and i == index:
            return arg
    return None


def _scheduler_lr(call: cst.Call, entry: Entry) -> cst.BaseExpression | None:
    """The learning rate an optimizer made from a scheduler takes: the scheduler's
    ``learning_rate`` argument, else that argument's table ``default`` (Paddle's NoamDecay
    defaults it to 1.0; a scheduler whose lambda gives the whole rate has 1.0)."""
    arg = argument(call, entry, "learning_rate")
    if arg is not None:
        return arg.value
    spec = entry.arg("learning_rate")
    return None if spec is None or spec.default is None else cst.parse_expression(spec.default)


def with_argument(
    args: Sequence[cst.Arg], entry: Entry, name: str, value: cst.BaseExpression
) -> list[cst.Arg]:
    """``args`` with the one bound to the source parameter ``name`` given ``value``."""
    index = next((i for i, a in enumerate(entry.args) if a.name == name), None)
    out = []
    for i, arg in enumerate(args):
        named = arg.keyword is not None and arg.keyword.value == name
        if named or (arg.keyword is None and i == index):
            arg = arg.with_changes(value=value)
        out.append(arg)
    return out


# -- steps and backwards ------------------------------------------------------------------


def _method_call(stmt: cst.CSTNode, method: MethodEntry) -> tuple[cst.Call, Entry] | None:
    """``<receiver>.<method>(...)`` alone on its line, with its table entry."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    func = small.value.func
    if not isinstance(func, cst.Attribute):
        return None
    entry = method(func.attr.value)
    return (small.value, entry) if entry is not None else None


def _backward_before(body: Sequence[cst.CSTNode], at: int, method: MethodEntry) -> cst.Call | None:
    """The last ``loss.backward()`` (an entry with ``needs_pair``) before ``body[at]``,
    in the block, in a ``with`` block in it, or in a ``for`` loop over several losses
    (one per device after ``split_and_load``: PyTorch adds their gradients into the one
    model, as the Trainer sums the devices'); None past another step."""
    for stmt in reversed(body[:at]):
        for candidate in _candidates(stmt):
            found = _method_call(candidate, method)
            if found is None:
                continue
            if found[1].needs_pair:
                return found[0]
            if any(a.moves for a in found[1].args):
                return None
    return None


def pair_steps(pairs: Pairs, body: Sequence[cst.CSTNode], method: MethodEntry) -> None:
    """``trainer.step(n)`` after ``loss.backward()``: n moves onto the backward."""
    for i, stmt in enumerate(body):
        found = _method_call(stmt, method)
        if found is None or not any(a.moves for a in found[1].args):
            continue
        call, entry = found
        spec = next(a for a in entry.args if a.moves)
        value = argument(call, entry, spec.name)
        backward = _backward_before(body, i, method)
        if value and not backward and gluon_loops.unpaired_backward_before(body, i):
            pairs.scaled[call] = value.value
        if value is None or backward is None or backward in pairs.divisor:
            continue
        pairs.divisor[backward] = value.value
        pairs.stepped_by[backward] = entry.receivers
        pairs.paired.add(call)


def _candidates(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    """Where a paired backward may be in ``stmt``, the last first: the statement itself; a
    ``with`` block's statements (a ``for`` loop among them as below); a ``for`` loop's."""
    if isinstance(stmt, cst.With):
        if not isinstance(stmt.body, cst.IndentedBlock):
            return []
        found: list[cst.CSTNode] = []
        for inner in reversed(stmt.body.body):
            found.extend(_loop(inner) if isinstance(inner, cst.For) else [inner])
        return found
    return _loop(stmt) if isinstance(stmt, cst.For) else [stmt]


def _loop(stmt: cst.For) -> list[cst.CSTNode]:
    """``for l in losses: l.backward()``: the loop's statements, the last first, down to
    one that reads a gradient (a backward before it would be read scaled: not paired)."""
    if stmt.orelse is not None or not isinstance(stmt.body, cst.IndentedBlock):
        return []
    found: list[cst.CSTNode] = []
    for inner in reversed(stmt.body.body):
        if ".grad" in code(inner):
            break
        found.append(inner)
    return found
