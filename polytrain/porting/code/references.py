"""Framework names and attributes used as values, not called: a base class, a dtype, a
class compared or checked against (``isinstance(m, nn.Linear)``, an annotation) by their
entry's target or value; an attribute entry read (``x.shape``); a layer's ``weight``
whose layout is the PyTorch layer's transpose (read as ``.mT`` in a product, else
marked)."""

from __future__ import annotations

import re

import libcst as cst
from libcst.metadata import ParentNodeProvider

from polytrain.porting.code import gluon_classes, methods, receivers, transposed_reads
from polytrain.porting.code.arguments import code
from polytrain.porting.code.port_pass import NOT_IN_TABLE, PortPass
from polytrain.porting.code.table import Entry

TRANSPOSED = (
    "the layer's weight is [out, in] in PyTorch, [in, out] in the source: write .T where its "
    "layout matters (a product, a copy), not where the tensor itself is meant (an initializer, "
    "an optimizer's parameters)"
)
_TYPE_PARTS = (
    cst.Subscript, cst.SubscriptElement, cst.Index, cst.Element, cst.Tuple, cst.List,
    cst.BinaryOperation,
)  # fmt: skip  # what a type in an annotation may be nested in


def attribute(
    port: PortPass, original: cst.Attribute, updated: cst.Attribute
) -> cst.BaseExpression:
    """A layer's ``weight``, an attribute entry read, else a framework name (``reference``)."""
    if original.attr.value == "weight" and (read := _transposed_weight(port, original)):
        return cst.Attribute(updated, cst.Name("mT")) if read == "product" else updated
    entry = port.method_entry(original.attr.value)
    if entry is not None and entry.kind == "attribute" and _read(port, original):
        port.done(original, entry.source)
        return methods.method_expression(
            port, original, entry.source, entry.target.replace("$self", code(updated.value)), set()
        )
    return reference(port, original, updated)


def _read(port: PortPass, node: cst.Attribute) -> bool:
    """``x.name`` read as a value of ``x``: not called, not a longer name's prefix, not
    assigned to, ``x`` not a module other than the frameworks'."""
    parent = port.get_metadata(ParentNodeProvider, node, None)
    return not (
        node in port.call_funcs
        or (isinstance(parent, cst.Attribute) and parent.value is node)
        or isinstance(parent, cst.AssignTarget | cst.Del)
        or (isinstance(parent, cst.AugAssign) and parent.target is node)
        or port.foreign(node.value)
    )


def _transposed_weight(port: PortPass, node: cst.Attribute) -> str:
    """``linear.weight`` of a layer made here whose weight is the PyTorch layer's
    transpose (Paddle's Linear: [in, out]; PyTorch's: [out, in]): marked, the layout
    being what the use decides (a product wants ``.T``, an initializer the tensor),
    unless transposed_reads knows the use: "product" (read as ``.mT``), "reduced"."""
    api = port.made_by.get(receivers.receiver_key(port, node.value))
    fw = next((fw for fw in port.imported if api is not None and api in fw.transposed), None)
    if fw is None:
        return ""
    if transposed_reads.in_product(node, port.parent, port.qualified, fw.root):
        port.done(node, f"{api}.weight")
        return "product"
    if transposed_reads.reduced(node, port.parent):
        port.done(node, f"{api}.weight")
        return "reduced"
    port.left(node, f"{api}.weight", TRANSPOSED)
    return ""


def reference(
    port: PortPass, original: cst.Attribute | cst.Name, updated: cst.BaseExpression
) -> cst.BaseExpression:
    """A framework name used as a value (a base class, a dtype), not called."""
    if original in port.call_funcs:
        return updated
    parent = port.get_metadata(ParentNodeProvider, original, None)
    if isinstance(parent, cst.Attribute) and parent.value is original:
        return updated  # a prefix of a longer name: the longer name decides
    value = getattr(parent, "default" if isinstance(parent, cst.Param) else "value", None)
    if isinstance(parent, cst.Attribute | cst.Arg | cst.Param) and original is not value:
        return updated  # an attribute's name or a keyword, not a value (a default is)
    found = port.resolved(original)
    if found is None or _dropped_argument(port, original):
        return updated  # not the framework's, or an argument its call's entry drops
    entry = found.framework.entries.get(found.name)
    if entry is None:
        port.left(original, found.name, found.framework.why_not(found.name) or NOT_IN_TABLE)
        return updated
    as_type = _as_type(entry) and _type_use(port, original)
    if entry.kind != "reference" and not as_type and not entry.value:
        why = entry.unsupported or "used without a call: its arguments cannot be converted"
        port.left(original, found.name, why)
        return updated
    port.done(original, found.name)
    value = entry.value if entry.kind != "reference" and not as_type else entry.target
    return port.target_expr(original, value)


def _dropped_argument(port: PortPass, node: cst.Name | cst.Attribute) -> bool:
    """``node`` is an argument that the entry of the call it is given to drops."""
    return bool(gluon_classes.taken_by_entries([node], port.parent, port.entry_of))


def _type_use(port: PortPass, node: cst.CSTNode) -> bool:
    """``node`` is compared (``type(m) == nn.Linear``) or is the type ``isinstance`` /
    ``issubclass`` checks against (alone or in a tuple), or an annotation: a class, not
    a call."""
    if _annotation(port, node):
        return True
    parent = port.get_metadata(ParentNodeProvider, node, None)
    if isinstance(parent, cst.Comparison | cst.ComparisonTarget):
        return True
    if isinstance(parent, cst.Element):
        parent = port.get_metadata(ParentNodeProvider, parent, None)
        if not isinstance(parent, cst.Tuple):
            return False
        parent = port.get_metadata(ParentNodeProvider, parent, None)
    if not isinstance(parent, cst.Arg):
        return False
    call = port.get_metadata(ParentNodeProvider, parent, None)
    return (
        isinstance(parent, cst.Arg)
        and isinstance(call, cst.Call)
        and isinstance(call.func, cst.Name)
        and call.func.value in ("isinstance", "issubclass")
        and len(call.args) == 2
        and call.args[1] is parent
    )


def _annotation(port: PortPass, node: cst.CSTNode) -> bool:
    """``node`` is a type annotation or inside one (``x: nn.Embedding``,
    ``-> Optional[Tuple[paddle.Tensor]]``, ``A | None``)."""
    current = port.get_metadata(ParentNodeProvider, node, None)
    while isinstance(current, _TYPE_PARTS):
        current = port.get_metadata(ParentNodeProvider, current, None)
    return isinstance(current, cst.Annotation)


def _as_type(entry: Entry) -> bool:
    """A call entry whose target is a name that every converted call makes an instance of
    (no layer wrapped around it, no chosen target, no result rewritten): as a type it is
    that name."""
    return (
        entry.kind == "call"
        and re.fullmatch(r"[A-Za-z_][\w.]*", entry.target) is not None
        and entry.target_by is None
        and not entry.result
        and not any(a.wrap or a.before for a in entry.args)
    )
