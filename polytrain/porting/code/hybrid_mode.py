"""Gluon's test of which module ``F`` is (``if F == mx.nd:``, ``F is mx.sym``) in a
function that receives ``F`` from a ``hybrid_forward`` (hybrid.py).

Gluon passes ``mxnet.nd`` when the block runs eagerly and ``mxnet.sym`` when it is
hybridized; the converted PyTorch ``forward`` has no ``F`` and always runs eagerly, as
with ``mxnet.nd``: the test is a constant, ``True`` for ``F == nd``, ``False`` for
``F == sym`` or any other name of the framework (``!=`` and ``is not`` the other way).
Only a single comparison of ``F`` with a name of the framework is one; any other use of
``F`` stays marked by hybrid.py."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import libcst as cst

from polytrain.porting.code.table import Framework

_EQUAL = (cst.Equal, cst.Is)
_NOT_EQUAL = (cst.NotEqual, cst.IsNot)


def mode_tests(
    bare: Sequence[cst.Name],
    parent_of: Callable[[cst.CSTNode], cst.CSTNode | None],
    names_of: Callable[[cst.CSTNode], Collection[str]],
    owner: Framework,
) -> dict[cst.Comparison, tuple[bool, str]]:
    """Each comparison of one of ``bare`` (an ``F`` hybrid.py cannot follow) with a name
    of ``owner`` (``names_of`` gives its qualified names) -> (its value in the converted
    code, the name). F is the table's ``module_parameter_as`` (mxnet.nd): equal to it, to
    no other name of the framework."""
    found: dict[cst.Comparison, tuple[bool, str]] = {}
    for name in bare:
        test = parent_of(name)
        if isinstance(test, cst.ComparisonTarget):  # ``nd == F``: F on the right
            test = parent_of(test)
        if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
            continue
        target = test.comparisons[0]
        if name not in (test.left, target.comparator):
            continue
        other = target.comparator if test.left is name else test.left
        names = {owner.canonical(n) for n in names_of(other)}
        value = _value(target.operator, names, owner.module_parameter_as, owner.root)
        if value is not None:
            found[test] = value
    return found


def _value(
    operator: cst.BaseCompOp, names: set[str], eager: str, root: str
) -> tuple[bool, str] | None:
    """The comparison's value when F is the ``eager`` module, with the name compared;
    None if the operator is not ==, !=, is, is not or the name not the framework's."""
    mine = sorted(n for n in names if n == root or n.startswith(root + "."))
    if len(mine) != 1 or len(names) != 1:
        return None
    if isinstance(operator, _EQUAL):
        same = True
    elif isinstance(operator, _NOT_EQUAL):
        same = False
    else:
        return None
    return ((mine[0] == eager) == same, mine[0])


def tested(
    name: cst.Name,
    tests: Collection[cst.Comparison],
    parent_of: Callable[[cst.CSTNode], cst.CSTNode | None],
) -> bool:
    """``name`` (an F) is a side of one of ``tests``: replaced, not marked."""
    test = parent_of(name)
    if isinstance(test, cst.ComparisonTarget):
        test = parent_of(test)
    return test in tests


def presence(node: cst.Comparison) -> tuple[str, cst.BaseExpression, bool] | None:
    """``'box_encode' in F.contrib.__dict__`` (a test of whether the framework has an
    operator): (the name, the module, True for ``in`` / False for ``not in``), or None."""
    if len(node.comparisons) != 1 or not isinstance(node.left, cst.SimpleString):
        return None
    target = node.comparisons[0]
    holder = target.comparator
    if not isinstance(target.operator, cst.In | cst.NotIn):
        return None
    if not (isinstance(holder, cst.Attribute) and holder.attr.value == "__dict__"):
        return None
    name = node.left.evaluated_value
    if not isinstance(name, str) or not name.isidentifier():
        return None
    return name, holder.value, isinstance(target.operator, cst.In)
