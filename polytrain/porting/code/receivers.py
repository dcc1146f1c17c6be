"""What made the objects a module calls methods of: every ``name = <framework call>``
(``self.x = ...`` too) records the API that made the name (``PortPass.made_by``), so that a
method entry with ``receivers`` converts ``opt.step()`` only on what an optimizer made,
and a layer's ``weight`` or ``__call__`` is read as its API's."""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ParentNodeProvider

from polytrain.porting.code import layer_self
from polytrain.porting.code.arguments import code
from polytrain.porting.code.port_pass import FOREIGN, PortPass, framework_of
from polytrain.porting.code.table import Entry


def find_receivers(port: PortPass, module: cst.Module) -> None:
    """Every ``name = <framework call>`` (``self.x = ...`` too): what made the name."""

    class Finder(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if len(node.targets) != 1 or not isinstance(node.value, cst.Call):
                return
            found = port.resolved(node.value.func)
            target = receiver_key(port, node.targets[0].target)
            if found is not None:
                port.made_by[target] = found.name
            elif port.foreign(node.value.func):  # ``env = gym.make(...)``
                port.made_by[target] = FOREIGN

    module.visit(Finder())


def receiver_key(port: PortPass, node: cst.CSTNode) -> str:
    """``node``'s code, ``self.x`` qualified by its class: two classes'
    ``self.downsample`` are two objects (a Sequential in one, a Conv2D in the other)."""
    text = code(node).strip()
    current = port.get_metadata(ParentNodeProvider, node, None)
    while text.startswith("self.") and current is not None:
        if isinstance(current, cst.ClassDef):
            return f"{current.name.value}:{text}"
        current = port.get_metadata(ParentNodeProvider, current, None)
    return text


def layer_api(port: PortPass, node: cst.BaseExpression) -> str | None:
    """The framework API that made ``node``: a call of it, or a name assigned one."""
    if isinstance(node, cst.Call):
        named = isinstance(node.func, cst.Name | cst.Attribute)
        return port.qualified(node.func) if named else None
    return port.made_by.get(receiver_key(port, node))


def receiver_api(port: PortPass, receiver: cst.BaseExpression) -> str | None:
    """The API whose call made ``receiver``; ``self`` of a layer class: the first of
    its framework's ``layer_classes`` (``paddle.nn.Layer``)."""
    made_by = port.made_by.get(receiver_key(port, receiver))
    name = receiver if isinstance(receiver, cst.Name) and made_by is None else None
    if name is not None and layer_self.self_of_layer(name, port.parent, port.layers):
        return next(fw.layer_classes[0] for fw in port.imported if fw.layer_classes)
    return made_by


def made_entry(port: PortPass, func: cst.BaseExpression) -> Entry | None:
    """The entry of the API whose call made the object ``func`` names in the module."""
    api = port.made_by.get(receiver_key(port, func))
    if api is None:
        return None
    fw = framework_of(api, port.tables)
    return fw.entries.get(api) if fw is not None else None


def shared(port: PortPass, backward: cst.Call) -> bool:
    """The module makes several objects of the kind that steps after ``backward`` (two
    Gluon Trainers: a GAN). One backward then reaches parameters another trainer
    steps: Gluon overwrites their gradients (grad_req='write'), PyTorch would add to
    what the other trainer's ``zero_grad()`` did not clear, so the table's helper
    (``gluon_backward``) clears what the loss reaches first."""
    makers = port.pairs.stepped_by.get(backward, ())
    return sum(1 for api in port.made_by.values() if api in makers) > 1
