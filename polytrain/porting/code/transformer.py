"""The libcst transformer of ``polytrain port-code``: framework uses found through their
imports, rewritten by the table, or left in place under a marker comment naming the API
and the reason. It finds what the module is when it enters it, then hands each node to
its rule family: calls.py (framework calls), methods.py (method calls), references.py
(names and attributes used as values), statements.py (whole statements), pairing.py
(statements paired in a block), the Gluon families (hybrid.py, hybrid_mode.py,
blocks.py, gluon_classes.py, gluon_loops.py); port_pass.py holds the pass's state."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from polytrain.porting.code import (
    array_functions,
    blocks,
    calls,
    gluon_classes,
    gluon_loops,
    hybrid,
    hybrid_mode,
    layer_self,
    methods,
    pairing,
    receivers,
    references,
    statements,
)
from polytrain.porting.code.arguments import code
from polytrain.porting.code.port_pass import PortPass


class PortTransformer(PortPass):
    """One pass over a module (port_pass.PortPass: its arguments and state), each node
    handed to its rule family."""

    # -- the module and its blocks ----------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        self._find_hybrid(node)
        self.block_inits = blocks.find(node, self._subclass_kwargs)
        fills = {m[1:] for f in self.imported for m, e in f.methods.items() if e.receivers}
        self.filled = blocks.filled(node, fills, self._makes_block)
        receivers.find_receivers(self, node)
        bases = {c for fw in self.imported for c in fw.layer_classes}
        self.layers = layer_self.layer_classes(node, self.qualified, bases)
        self.itself = array_functions.module_itself(node)  # d2l = sys.modules[__name__]
        modules = array_functions.block_bases(self.imported)
        self.gluon_blocks = layer_self.layer_classes(node, self.qualified, modules)
        self._pair(node, node.body)

    def _find_hybrid(self, node: cst.Module) -> None:
        """Gluon's ``hybrid_forward(self, F, ...)`` functions; the uses of ``F`` the tool
        cannot follow marked, unless an entry drops them or they test which module F is."""
        params = [f.module_parameter for f in self.imported if f.module_parameter_as]
        self.hybrid = hybrid.find(node, params[0] if params else "")
        taken = gluon_classes.taken_by_entries(self.hybrid.bare, self.parent, self.entry_of)
        self.hybrid.bare = [b for b in self.hybrid.bare if b not in taken]  # F dropped
        if self.hybrid.param:
            owner = next(f for f in self.imported if f.module_parameter == self.hybrid.param)
            self.modes = hybrid_mode.mode_tests(self.hybrid.bare, self.parent, self.names_of, owner)
        self.hybrid.bare = [
            b for b in self.hybrid.bare if not hybrid_mode.tested(b, self.modes, self.parent)
        ]
        for bare in self.hybrid.bare:
            self.left(bare, self.hybrid.param, hybrid.PASSED_ON)
        for getter in self.hybrid.getters:
            if gluon_classes.parameter_call(getter) is None:
                self.left(getter, "Block.params.get", hybrid.PARAMETER)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._pair(node, node.body)

    def _pair(self, block: cst.CSTNode, body: Sequence[cst.CSTNode]) -> None:
        """The statements of ``block`` paired (pairing.py)."""
        pairing.pair_schedulers(self.pairs, block, body, self.entry_named)
        pairing.pair_steps(self.pairs, body, self.method_entry)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._moved(original, updated.body))

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated.with_changes(body=self._moved(original, updated.body))

    def _moved(self, block: cst.CSTNode, body: Sequence[cst.BaseStatement]) -> list:
        """The converted ``body`` of ``block``, its paired statements moved (pairing.py)."""
        return pairing.moved(self.pairs, block, body, self.made)

    def _makes_block(self, call: cst.Call) -> bool:
        """``call`` makes a framework layer (its target in the module of the sequential)."""
        found = self.resolved(call.func)
        entry = found.framework.entries.get(found.name) if found else None
        home = found.framework.sequential.rpartition(".")[0] if found else ""
        return entry is not None and bool(home) and entry.target.startswith(home + ".")

    def _subclass_kwargs(self, base: cst.BaseExpression) -> str:
        entry = self.entry_named(base)
        return entry.subclass_kwargs if entry else ""

    # -- nodes ------------------------------------------------------------------------------

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Comparison(self, node: cst.Comparison) -> bool:
        self._presence(node)
        return node not in self.modes  # ``F == mx.nd``: replaced whole (hybrid_mode.py)

    def _presence(self, node: cst.Comparison) -> None:
        """``'op' in F.contrib.__dict__``: True where the table converts that operator
        (the converted code has it), else left as it is (marked)."""
        found = hybrid_mode.presence(node)
        resolved = self.resolved(found[1]) if found is not None else None
        if found is None or resolved is None:
            return
        entry = resolved.framework.entries.get(f"{resolved.name}.{found[0]}")
        if entry is not None and entry.target and not entry.unsupported:
            self.modes[node] = (found[2], f"{resolved.name}.__dict__")

    def leave_Comparison(
        self, original: cst.Comparison, updated: cst.Comparison
    ) -> cst.BaseExpression:
        if original not in self.modes:
            return updated
        value, module = self.modes[original]
        self.done(original, module)
        return cst.Name(str(value), lpar=updated.lpar, rpar=updated.rpar)

    def visit_Call(self, node: cst.Call) -> None:
        self.call_funcs.add(node.func)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        updated = self.hybrid.leave_call(original, updated)  # F passed on: dropped
        if original in self.hybrid.getters and (made := gluon_classes.parameter_call(updated)):
            self.done(original, "Block.params.get")
            self.full(code(made.func))  # the helper defined
            return made
        made = self.block_inits.leave_call(original, updated)  # a block's super().__init__
        if made is not updated:
            self.full(self.block_inits.calls[original])  # the helper defined
        updated = made
        updated = gluon_loops.shared_block(updated, self.entry_of(original))  # params=b.params
        return calls.grouped(self, original, calls.converted_call(self, original, updated))

    def leave_FunctionDef(
        self, original: cst.FunctionDef, updated: cst.FunctionDef
    ) -> cst.FunctionDef:
        return self.hybrid.leave_def(original, updated)

    def leave_With(
        self, original: cst.With, updated: cst.With
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        return statements.flattened_with(self, original, updated)

    def leave_Attribute(
        self, original: cst.Attribute, updated: cst.Attribute
    ) -> cst.BaseExpression:
        return references.attribute(self, original, updated)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return references.reference(self, original, updated)

    def leave_BinaryOperation(
        self, original: cst.BinaryOperation, updated: cst.BinaryOperation
    ) -> cst.BaseExpression:
        """``a.parameters() + b.parameters()``: lists in the source, iterators in PyTorch."""
        return methods.listed_sum(self, updated)

    # -- statements -------------------------------------------------------------------------

    def on_visit(self, node: cst.CSTNode) -> bool:
        """A statement the last pass failed on is not entered (statements.py)."""
        if not statements.entered(self, node):
            return False
        return super().on_visit(node)

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        result = super().on_leave(original_node, updated_node)
        result = statements.converted(self, original_node, result)
        statements.left_whole(self, original_node)
        return result
