"""Gluon's training-loop calls whose PyTorch form depends on the statements around them.

``trainer.step(n)`` normally gives its ``1 / n`` to the ``loss.backward()`` statement before
it (transformer.py pairs them). Where that backward is not a statement of its own
(``[l.backward() for l in losses]``, d2l's multi-device loops), the backward becomes
``gluon_backward(l)`` (it writes the gradients, as Gluon does) and the step becomes
``gluon_step(trainer, n)``: the gradients divided by n, the update, the gradients cleared:
Gluon's ``Trainer.step`` on the gradients it finds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from polytrain.porting.code.table import Entry

STEP_HELPER = "gluon_step"


def _methods(node: cst.CSTNode, name: str) -> list[cst.CSTNode]:
    """The calls of a method ``name`` anywhere in ``node``."""
    pattern = m.Call(func=m.Attribute(attr=m.Name(name)))
    return list(m.findall(node, pattern))


def unpaired_backward_before(body: Sequence[cst.CSTNode], at: int) -> bool:
    """Whether the statements before ``body[at]`` (a step no backward statement took the
    division of) hold a ``.backward(...)`` inside an expression, with no other
    ``.step(...)`` between: that backward writes the gradients the step divides."""
    for stmt in reversed(body[:at]):
        if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
            continue  # defined, not run here
        if _methods(stmt, "step") or m.findall(stmt, m.Lambda()):
            return False  # a lambda's backward may never run
        if _methods(stmt, "backward"):
            return True
    return False


def step_call(receiver: cst.BaseExpression, batch_size: cst.BaseExpression) -> cst.Call:
    """``gluon_step(trainer, n)``."""
    return cst.Call(cst.Name(STEP_HELPER), [cst.Arg(receiver), cst.Arg(batch_size)])


# ---- with autograd.predict_mode(): around calls of the block's own blocks -----------------

PREDICT_MODE = ".predict_mode"  # the API's last name (the entry is gluon.toml's)
PREDICT_HELPER = "gluon_predict_mode"


def predict_mode(
    call: cst.Call, parent_of: Callable[[cst.CSTNode], cst.CSTNode | None]
) -> cst.Call | None:
    """``with autograd.predict_mode():`` in a method whose block calls only blocks of
    ``self`` (``out = self.decoder(x)``) as ``with gluon_predict_mode(self.decoder):``:
    those modules in eval mode for the block (MXNet's training flag off: dropout off,
    batch norm on its running statistics), their modes restored after; None anywhere
    else (another call in the block could depend on the mode: left marked)."""
    item = parent_of(call)
    statement = parent_of(item) if isinstance(item, cst.WithItem) else None
    if not isinstance(statement, cst.With) or len(statement.items) != 1 or call.args:
        return None
    assert isinstance(item, cst.WithItem)
    methods = _methods_of_class(statement, parent_of)
    if item.asname or methods is None:
        return None
    blocks: dict[str, cst.BaseExpression] = {}
    for inner in m.findall(statement.body, m.Call() | m.Lambda() | m.FunctionDef()):
        func = inner.func if isinstance(inner, cst.Call) else None
        if not _self_attribute(func) or func.attr.value in methods:  # type: ignore[union-attr]
            return None
        assert isinstance(func, cst.Attribute)
        blocks.setdefault(func.attr.value, func)
    if not blocks:
        return None
    return cst.Call(cst.Name(PREDICT_HELPER), [cst.Arg(b) for b in blocks.values()])


def _self_attribute(func: cst.BaseExpression | None) -> bool:
    """``self.<name>``."""
    pattern = m.Attribute(value=m.Name("self"), attr=m.Name())
    return func is not None and m.matches(func, pattern)


def _methods_of_class(
    node: cst.CSTNode, parent_of: Callable[[cst.CSTNode], cst.CSTNode | None]
) -> set[str] | None:
    """The method names of the class whose method holds ``node`` (``self.name(...)`` of
    one is not a block); None outside a class's method."""
    current = parent_of(node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = parent_of(current)
    body = parent_of(current) if current is not None else None
    owner = parent_of(body) if body is not None else None  # the class
    if not isinstance(owner, cst.ClassDef) or not isinstance(owner.body, cst.IndentedBlock):
        return None
    return {s.name.value for s in owner.body.body if isinstance(s, cst.FunctionDef)}


# ---- nn.Dense(..., params=other.params): tied weights --------------------------------------

SHARED_HELPER = "gluon_shared"  # the `around` helper of a layer's `params=` (gluon.toml)


def shared_block(call: cst.Call, entry: Entry | None) -> cst.Call:
    """``params=<block>.params`` of a layer whose entry ties parameters through the helper,
    as ``params=<block>``: in PyTorch the block itself holds them. Another value is
    left as it is (the helper refuses what is not a module when it runs)."""
    names = {a.name for a in entry.args if a.around == SHARED_HELPER} if entry else set()
    args = []
    for arg in call.args:
        value = arg.value
        if arg.keyword and arg.keyword.value in names and _params_of(value):
            assert isinstance(value, cst.Attribute)
            arg = arg.with_changes(value=value.value)
        args.append(arg)
    return call.with_changes(args=args)


def _params_of(value: cst.BaseExpression) -> bool:
    return m.matches(value, m.Attribute(attr=m.Name("params")))
