"""Gluon's class-level helpers that take the module ``F`` as an argument.

A Loss subclass's ``hybrid_forward(self, F, ...)`` hands its ``F`` to Gluon's own helpers
(``_reshape_like(F, label, pred)``, ``_apply_weighting(F, loss, w, sw)``). Their table
entries drop that argument whatever it is (``drop = ["*"]``), so such an ``F`` is not one
the tool cannot follow (hybrid.py marks those): the converted call no longer has it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst

from polytrain.porting.code.table import ANY, Entry

_Value = cst.Name | cst.Attribute


def taken_by_entries(
    bare: Sequence[_Value],
    parent_of: Callable[[cst.CSTNode], cst.CSTNode | None],
    entry_of: Callable[[cst.Call], Entry | None],
) -> list[_Value]:
    """The names of ``bare`` that are a positional argument of a framework call whose
    entry drops that argument, whatever its value (``_reshape_like(F, x, y)``, or
    ``_reshape_like(nd, x, y)`` outside a block)."""
    taken: list[_Value] = []
    for name in bare:
        arg = parent_of(name)
        call = parent_of(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(arg, cst.Arg) or not isinstance(call, cst.Call) or arg.keyword:
            continue
        entry = entry_of(call)
        index = call.args.index(arg)
        if entry is not None and index < len(entry.args) and _dropped(entry, index):
            taken.append(name)
    return taken


def _dropped(entry: Entry, index: int) -> bool:
    spec = entry.args[index]
    return spec.to is None and ANY in spec.drop and not spec.packs


# ---- a block's parameters: self.params.get(...) ---------------------------------------------

PARAMETER_HELPERS = {"get": "gluon_parameter", "get_constant": "gluon_constant"}
_KEYWORDS = {
    "get": {
        "shape", "dtype", "lr_mult", "wd_mult", "init", "allow_deferred_init",
        "differentiable", "stype", "grad_stype", "grad_req",
    },
    "get_constant": {"value"},
}  # fmt: skip


def parameter_call(call: cst.Call) -> cst.Call | None:
    """``self.params.get('w', shape=..., init=...)`` as ``gluon_parameter('w', ...)`` (and
    ``get_constant`` as ``gluon_constant``): the helpers take Gluon's arguments by the same
    names; None where an argument is one they do not know (or hidden by ``*``/``**``)."""
    assert isinstance(call.func, cst.Attribute)
    method = call.func.attr.value
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or not 1 <= len(positional) <= len(_order(method)):
        return None
    if any(a.keyword.value not in _KEYWORDS[method] for a in call.args if a.keyword):
        return None
    return call.with_changes(func=cst.Name(PARAMETER_HELPERS[method]))


def _order(method: str) -> tuple[str, ...]:
    """The parameters a getter takes by position: the name (and a constant's value)."""
    return ("name", "value") if method == "get_constant" else ("name",)
