"""The libcst transformer of ``polytrain port-code``: framework uses found through their
imports (libcst's qualified names resolve ``import paddle.nn as nn``, ``from paddle
import nn`` and the rest), rewritten by the table, or left in place under a marker
comment naming the API and the reason."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import (
    CodeRange,
    ParentNodeProvider,
    PositionProvider,
    QualifiedName,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from polytrain.porting.code import (
    array_functions,
    blocks,
    default_dtype,
    gluon_classes,
    gluon_loops,
    hybrid,
    hybrid_mode,
    layer_self,
    transposed_reads,
    weight_layout,
)
from polytrain.porting.code.arguments import NO_SPACE, NotConverted, code, convert_arguments
from polytrain.porting.code.report import Use
from polytrain.porting.code.table import Entry, Framework

MARKER = "# polytrain port-code: {api} not converted: {why}"
STATEMENT = "(statement)"  # the API a statement left whole after a failure is reported as
FOREIGN = "(another module)"  # what made a name assigned from a call of a non-framework import
FAILED = "the tool failed on this statement ({error}); it is left as it was"
NOT_IN_TABLE = "not in the mapping table yet"
TRANSPOSED = (
    "the layer's weight is [out, in] in PyTorch, [in, out] in the source: write .T where its "
    "layout matters (a product, a copy), not where the tensor itself is meant (an initializer, "
    "an optimizer's parameters)"
)
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
_RECEIVER = "__polytrain_receiver__"
Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement


def framework_of(name: str, tables: Mapping[str, Framework]) -> Framework | None:
    root = name.split(".", 1)[0]
    return tables.get(root)


@dataclass(frozen=True)
class Resolved:
    framework: Framework
    name: str  # the qualified name, e.g. paddle.nn.Linear


class PortTransformer(cst.CSTTransformer):
    """One pass over a module. ``aliases``: import aliases of source modules kept as
    aliases of their target modules (local name -> target module); the other converted
    uses are written with the target's full name (``needs_root`` then says so)."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, ParentNodeProvider, PositionProvider)

    def __init__(
        self,
        tables: Mapping[str, Framework],
        imported: Iterable[str],
        aliases: Mapping[str, str],
        skip: Mapping[tuple[int, int], str] | None = None,
    ) -> None:
        super().__init__()
        self.skip = dict(skip or {})  # statement position -> the error that left it whole
        self.inside: list[tuple[int, int]] = []  # positions of the statements being visited
        self.tables = tables
        self.imported = [tables[r] for r in imported if r in tables]  # method tables in use
        self.aliases = dict(aliases)
        self.uses: list[Use] = []
        self.needs_root: set[str] = set()
        self._markers: dict[cst.CSTNode, list[str]] = {}
        self._call_funcs: set[cst.CSTNode] = set()
        self._flatten: set[cst.CSTNode] = set()
        self._scheduler_of: dict[cst.CSTNode, str] = {}  # scheduler call -> optimizer name
        self._lr_of: dict[cst.CSTNode, cst.BaseExpression] = {}  # optimizer call -> its lr
        self._moves: dict[cst.CSTNode, list[tuple[cst.CSTNode, cst.CSTNode]]] = {}
        self._made: dict[cst.CSTNode, list[cst.CSTNode]] = {}
        self._made_by: dict[str, str] = {}  # receiver code -> the API whose call made it
        self._divisor: dict[cst.CSTNode, cst.BaseExpression] = {}  # backward call -> n
        self._paired: set[cst.CSTNode] = set()  # step calls whose argument moved
        self._scaled: dict[cst.CSTNode, cst.BaseExpression] = {}  # step -> n: gluon_step
        self._stepped_by: dict[cst.CSTNode, tuple[str, ...]] = {}  # backward -> step's makers
        self._then: dict[cst.CSTNode, str] = {}  # statement -> a statement added after it
        self._removed: set[cst.CSTNode] = set()
        self.helpers: dict[str, str] = {}  # table helpers the converted code calls: name -> code
        self._hybrid = hybrid.Hybrid()  # Gluon's hybrid_forward(self, F, ...) (visit_Module)
        self._modes: dict[cst.Comparison, tuple[bool, str]] = {}  # ``F == nd``: constant
        self._blocks = blocks.Blocks()  # super().__init__(**kwargs) of blocks (visit_Module)
        self._filled: set[cst.Call] = set()  # ``out.add(nn.Conv2D(...))``, out a parameter
        self._layers: set[cst.ClassDef] = set()  # classes derived from a layer (visit_Module)
        self._itself: set[str] = set()  # names of the module itself (visit_Module)
        self._gluon_blocks: set[cst.ClassDef] = set()  # classes derived from a Gluon Block

    # -- lookups ------------------------------------------------------------------------

    def _resolve(self, node: cst.CSTNode) -> Resolved | None:
        if not _dotted(node):  # ``f(x).detach``: an attribute of a value, not a name
            return None
        if self._hybrid.head(node) is not None:  # ``F.x``: the table's module's x
            owner = next(f for f in self.imported if f.module_parameter == self._hybrid.param)
            name = owner.module_parameter_as + code(node).strip()[len(self._hybrid.param) :]
            return Resolved(owner, owner.canonical(name))
        none: Collection[QualifiedName] = ()
        names = self.get_metadata(QualifiedNameProvider, node, none)
        for q in sorted(names, key=lambda q: q.name):
            if q.source is QualifiedNameSource.IMPORT:
                fw = framework_of(q.name, self.tables)
                if fw is not None:
                    return Resolved(fw, fw.canonical(q.name))
        return None

    def _names(self, node: cst.CSTNode) -> set[str]:
        """The qualified names of a name or attribute (``np.int32``: numpy.int32)."""
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, ())}

    def _line(self, node: cst.CSTNode) -> int:
        where: CodeRange = self.get_metadata(PositionProvider, node)
        return where.start.line

    def _statement(self, node: cst.CSTNode) -> cst.CSTNode:
        current = node
        while not isinstance(current, Statement):
            current = self.get_metadata(ParentNodeProvider, current)
        return current

    def _method(self, name: str) -> Entry | None:
        for fw in self.imported:
            entry = fw.methods.get("." + name)
            if entry is not None:
                return entry
        return None

    # -- results --------------------------------------------------------------------------

    def _done(self, node: cst.CSTNode, api: str) -> None:
        self.uses.append(Use(self._line(node), api))

    def _left(self, node: cst.CSTNode, api: str, why: str) -> None:
        why = " ".join(why.split())  # a comment is one line: a multi-line argument joined
        self.uses.append(Use(self._line(node), api, why))
        self._markers.setdefault(self._statement(node), []).append(MARKER.format(api=api, why=why))

    def _target_expr(self, original: cst.BaseExpression, target: str) -> cst.BaseExpression:
        """``target`` through a kept alias when the use went through one, else in full."""
        head = original
        while isinstance(head, cst.Attribute):
            head = head.value
        if isinstance(head, cst.Name) and head.value in self.aliases:
            module = self.aliases[head.value]
            if target.startswith(module + "."):
                return cst.parse_expression(head.value + target[len(module) :])
        return self._full(target)

    def _full(self, text: str) -> cst.BaseExpression:
        for fw in self.tables.values():
            if text == fw.target_root or text.startswith(fw.target_root + "."):
                self.needs_root.add(fw.target_root)
            if text in fw.helpers:
                self._helper(fw, text)
            elif "(" in text:  # a target through a helper: ``gluon_deferred(...)``
                self._helpers_named(fw, text)
        return cst.parse_expression(text)

    def _helper(self, fw: Framework, name: str) -> None:
        """A table helper the converted code calls: defined in the file with the helpers
        its code names, their imports added."""
        if name in self.helpers:
            return
        self.helpers[name] = fw.helpers[name]
        if f"{fw.target_root}." in fw.helpers[name]:
            self.needs_root.add(fw.target_root)
        self._helpers_named(fw, fw.helpers[name])

    def _helpers_named(self, fw: Framework, text: str) -> None:
        """The helpers ``text`` names: the framework's own, else another table's (a d2lzh
        loader reads Gluon's datasets)."""
        for table in (fw, *(f for f in self.tables.values() if f is not fw)):
            for other in table.helpers:
                own = table is fw or other not in fw.helpers
                if own and re.search(rf"\b{other}\b", text):
                    self._helper(table, other)

    def _table_code(self, fw: Framework, text: str) -> cst.BaseExpression:
        """Code from the table (a converted value, a wrapping layer): its target names are
        written in full, the helpers it names defined."""
        if fw.target_root in text:
            self.needs_root.add(fw.target_root)
        self._helpers_named(fw, text)
        return cst.parse_expression(text)

    # -- schedulers -----------------------------------------------------------------------

    def _assigned_call(self, stmt: cst.CSTNode) -> tuple[str, cst.Call, Entry] | None:
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
        entry = self._entry_named(small.value.func)
        if entry is None:
            return None
        return small.targets[0].target.value, small.value, entry

    def _pair_schedulers(self, block: cst.CSTNode, body: Sequence[cst.CSTNode]) -> None:
        """``sched = <scheduler>(learning_rate=LR, ...)`` followed in the same block by
        ``opt = <optimizer>(learning_rate=sched, ...)``: PyTorch builds the scheduler on the
        optimizer, so the optimizer takes LR and the scheduler moves after it."""
        pending: dict[str, tuple[cst.CSTNode, cst.Call, Entry]] = {}
        for stmt in body:
            found = self._assigned_call(stmt)
            if found is not None and found[2].kind == "scheduler":
                pending[found[0]] = (stmt, found[1], found[2])
                continue
            if found is None or not pending:
                continue
            name, call, entry = found
            lr_arg = _argument(call, entry, "learning_rate")
            if lr_arg is None or not isinstance(lr_arg.value, cst.Name):
                continue
            sched = pending.pop(lr_arg.value.value, None)
            if sched is None:
                continue
            sched_stmt, sched_call, sched_entry = sched
            lr = _scheduler_lr(sched_call, sched_entry)
            if lr is None:
                continue
            self._scheduler_of[sched_call] = name
            self._lr_of[call] = lr
            self._moves.setdefault(block, []).append((sched_stmt, stmt))

    def visit_Module(self, node: cst.Module) -> None:
        params = [f.module_parameter for f in self.imported if f.module_parameter_as]
        self._hybrid = hybrid.find(node, params[0] if params else "")
        taken = gluon_classes.taken_by_entries(self._hybrid.bare, self._parent, self._entry_of)
        self._hybrid.bare = [b for b in self._hybrid.bare if b not in taken]  # F dropped
        if self._hybrid.param:
            owner = next(f for f in self.imported if f.module_parameter == self._hybrid.param)
            self._modes = hybrid_mode.mode_tests(
                self._hybrid.bare, self._parent, self._names, owner
            )
        self._hybrid.bare = [
            b for b in self._hybrid.bare if not hybrid_mode.tested(b, self._modes, self._parent)
        ]
        for bare in self._hybrid.bare:
            self._left(bare, self._hybrid.param, hybrid.PASSED_ON)
        for getter in self._hybrid.getters:
            if gluon_classes.parameter_call(getter) is None:
                self._left(getter, "Block.params.get", hybrid.PARAMETER)
        self._blocks = blocks.find(node, self._subclass_kwargs)
        fills = {m[1:] for f in self.imported for m, e in f.methods.items() if e.receivers}
        self._filled = blocks.filled(node, fills, self._makes_block)
        self._find_receivers(node)
        bases = {c for fw in self.imported for c in fw.layer_classes}
        self._layers = layer_self.layer_classes(node, self._qualified, bases)
        self._itself = array_functions.module_itself(node)  # d2l = sys.modules[__name__]
        modules = array_functions.block_bases(self.imported)
        self._gluon_blocks = layer_self.layer_classes(node, self._qualified, modules)
        self._pair_schedulers(node, node.body)
        self._pair_steps(node.body)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._pair_schedulers(node, node.body)
        self._pair_steps(node.body)

    # -- receivers and paired statements ---------------------------------------------------

    def _find_receivers(self, module: cst.Module) -> None:
        """Every ``name = <framework call>`` (``self.x = ...`` too): what made the name."""
        outer = self

        class Finder(cst.CSTVisitor):
            def visit_Assign(self, node: cst.Assign) -> None:
                if len(node.targets) != 1 or not isinstance(node.value, cst.Call):
                    return
                found = outer._resolve(node.value.func)
                target = outer._receiver_key(node.targets[0].target)
                if found is not None:
                    outer._made_by[target] = found.name
                elif outer._foreign(node.value.func):  # ``env = gym.make(...)``
                    outer._made_by[target] = FOREIGN

        module.visit(Finder())

    def _receiver_key(self, node: cst.CSTNode) -> str:
        """``node``'s code, ``self.x`` qualified by its class: two classes'
        ``self.downsample`` are two objects (a Sequential in one, a Conv2D in the other)."""
        text = code(node).strip()
        current = self.get_metadata(ParentNodeProvider, node, None)
        while text.startswith("self.") and current is not None:
            if isinstance(current, cst.ClassDef):
                return f"{current.name.value}:{text}"
            current = self.get_metadata(ParentNodeProvider, current, None)
        return text

    def _qualified(self, node: cst.BaseExpression) -> str | None:
        found = self._resolve(node)
        return found.name if found is not None else None

    def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.get_metadata(ParentNodeProvider, node, None)

    def _layer_api(self, node: cst.BaseExpression) -> str | None:
        """The framework API that made ``node``: a call of it, or a name assigned one."""
        if isinstance(node, cst.Call):
            named = isinstance(node.func, cst.Name | cst.Attribute)
            return self._qualified(node.func) if named else None
        return self._made_by.get(self._receiver_key(node))

    def _receiver_api(self, receiver: cst.BaseExpression) -> str | None:
        """The API whose call made ``receiver``; ``self`` of a layer class: the first of
        its framework's ``layer_classes`` (``paddle.nn.Layer``)."""
        made_by = self._made_by.get(self._receiver_key(receiver))
        name = receiver if isinstance(receiver, cst.Name) and made_by is None else None
        if name is not None and layer_self.self_of_layer(name, self._parent, self._layers):
            return next(fw.layer_classes[0] for fw in self.imported if fw.layer_classes)
        return made_by

    def _method_call(self, stmt: cst.CSTNode) -> tuple[cst.Call, Entry] | None:
        """``<receiver>.<method>(...)`` alone on its line, with its table entry."""
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return None
        small = stmt.body[0]
        if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
            return None
        func = small.value.func
        if not isinstance(func, cst.Attribute):
            return None
        entry = self._method(func.attr.value)
        return (small.value, entry) if entry is not None else None

    def _backward_before(self, body: Sequence[cst.CSTNode], at: int) -> cst.Call | None:
        """The last ``loss.backward()`` (an entry with ``needs_pair``) before ``body[at]``,
        in the block, in a ``with`` block in it, or in a ``for`` loop over several losses
        (one per device after ``split_and_load``: PyTorch adds their gradients into the one
        model, as the Trainer sums the devices'); None past another step."""
        for stmt in reversed(body[:at]):
            for candidate in _candidates(stmt):
                found = self._method_call(candidate)
                if found is None:
                    continue
                if found[1].needs_pair:
                    return found[0]
                if any(a.moves for a in found[1].args):
                    return None
        return None

    def _pair_steps(self, body: Sequence[cst.CSTNode]) -> None:
        """``trainer.step(n)`` after ``loss.backward()``: n moves onto the backward."""
        for i, stmt in enumerate(body):
            found = self._method_call(stmt)
            if found is None or not any(a.moves for a in found[1].args):
                continue
            call, entry = found
            spec = next(a for a in entry.args if a.moves)
            value = _argument(call, entry, spec.name)
            backward = self._backward_before(body, i)
            if value and not backward and gluon_loops.unpaired_backward_before(body, i):
                self._scaled[call] = value.value
            if value is None or backward is None or backward in self._divisor:
                continue
            self._divisor[backward] = value.value
            self._stepped_by[backward] = entry.receivers
            self._paired.add(call)

    def _moved(self, original: cst.CSTNode, body: Sequence[cst.BaseStatement]) -> list:
        out = list(body)
        for sched_stmt, opt_stmt in self._moves.get(original, []):
            made_s, made_o = self._made.get(sched_stmt, []), self._made.get(opt_stmt, [])
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

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._moved(original, updated.body))

    def leave_IndentedBlock(
        self, original: cst.IndentedBlock, updated: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated.with_changes(body=self._moved(original, updated.body))

    # -- visitors -------------------------------------------------------------------------

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Comparison(self, node: cst.Comparison) -> bool:
        self._presence(node)
        return node not in self._modes  # ``F == mx.nd``: replaced whole (hybrid_mode.py)

    def _presence(self, node: cst.Comparison) -> None:
        """``'op' in F.contrib.__dict__``: True where the table converts that operator
        (the converted code has it), else left as it is (marked)."""
        found = hybrid_mode.presence(node)
        resolved = self._resolve(found[1]) if found is not None else None
        if found is None or resolved is None:
            return
        entry = resolved.framework.entries.get(f"{resolved.name}.{found[0]}")
        if entry is not None and entry.target and not entry.unsupported:
            self._modes[node] = (found[2], f"{resolved.name}.__dict__")

    def leave_Comparison(
        self, original: cst.Comparison, updated: cst.Comparison
    ) -> cst.BaseExpression:
        if original not in self._modes:
            return updated
        value, module = self._modes[original]
        self._done(original, module)
        return cst.Name(str(value), lpar=updated.lpar, rpar=updated.rpar)

    def visit_Call(self, node: cst.Call) -> None:
        self._call_funcs.add(node.func)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        updated = self._hybrid.leave_call(original, updated)  # F passed on: dropped
        if original in self._hybrid.getters and (made := gluon_classes.parameter_call(updated)):
            self._done(original, "Block.params.get")
            self._full(code(made.func))  # the helper defined
            return made
        made = self._blocks.leave_call(original, updated)  # a block's super().__init__
        if made is not updated:
            self._full(self._blocks.calls[original])  # the helper defined
        updated = made
        updated = gluon_loops.shared_block(updated, self._entry_of(original))  # params=b.params
        return self._grouped(original, self._converted_call(original, updated))

    def _makes_block(self, call: cst.Call) -> bool:
        """``call`` makes a framework layer (its target in the module of the sequential)."""
        found = self._resolve(call.func)
        entry = found.framework.entries.get(found.name) if found else None
        home = found.framework.sequential.rpartition(".")[0] if found else ""
        return entry is not None and bool(home) and entry.target.startswith(home + ".")

    def _entry_named(self, node: cst.BaseExpression) -> Entry | None:
        """The table entry of the framework API ``node`` names, if any."""
        found = self._resolve(node)
        return found.framework.entries.get(found.name) if found else None

    def _entry_of(self, call: cst.Call) -> Entry | None:
        return self._entry_named(call.func)

    def _dropped_argument(self, node: cst.Name | cst.Attribute) -> bool:
        return bool(gluon_classes.taken_by_entries([node], self._parent, self._entry_of))

    def _subclass_kwargs(self, base: cst.BaseExpression) -> str:
        entry = self._entry_named(base)
        return entry.subclass_kwargs if entry else ""

    def leave_FunctionDef(
        self, original: cst.FunctionDef, updated: cst.FunctionDef
    ) -> cst.FunctionDef:
        return self._hybrid.leave_def(original, updated)

    def _converted_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        named = isinstance(original.func, cst.Name | cst.Attribute)
        found = self._resolve(original.func) if named else None
        if found is not None:
            return self._convert_call(original, updated, found)
        made = self._made_entry(original.func) if named and not original.args else None
        if made is not None and made.called:
            self._done(original, f"{made.source}()")
            return cst.parse_expression(made.called.replace("$self", code(updated.func)))
        if isinstance(original.func, cst.Attribute) and self._hybrid_f(original.func.value):
            self._left(original, f"F.{original.func.attr.value}", HYBRID_F)
            return updated
        if isinstance(original.func, cst.Attribute) and not self._elsewhere(original.func.value):
            entry = self._method(original.func.attr.value)
            if entry is not None and entry.kind != "attribute":
                return self._convert_method(original, updated, entry)
        return updated

    def _grouped(self, original: cst.Call, made: cst.BaseExpression) -> cst.BaseExpression:
        """``made`` in parentheses where it is an operation (an expression entry's ``a * b``,
        ``lambda w: ...``) whose place binds tighter: called, an attribute's or a
        subscript's value, an operand."""
        if made.lpar or isinstance(made, _ATOMS):
            return made
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if isinstance(parent, _LOOSE) or parent is None:
            return made
        return made.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def _made_entry(self, func: cst.BaseExpression) -> Entry | None:
        """The entry of the API whose call made the object ``func`` names in the module."""
        api = self._made_by.get(self._receiver_key(func))
        if api is None:
            return None
        fw = framework_of(api, self.tables)
        return fw.entries.get(api) if fw is not None else None

    def _elsewhere(self, receiver: cst.BaseExpression) -> bool:
        """``receiver`` is another module's (``_foreign``) or a result of that module's call
        (``np.ones(3).astype``: a chain of calls from it)."""
        while isinstance(receiver, cst.Call | cst.Attribute | cst.Subscript):
            receiver = receiver.func if isinstance(receiver, cst.Call) else receiver.value
            if self._foreign(receiver):
                return True
        if isinstance(receiver, cst.Name) and receiver.value in self._itself:
            return True  # ``d2l.exp(x)``: the file's own function
        return self._foreign(receiver)

    def _foreign(self, receiver: cst.BaseExpression) -> bool:
        """``receiver`` names something imported from another module than the frameworks'
        (``math`` in ``math.exp(x)``, ``np`` in ``np.sqrt(x)``): a function of that module
        is called, not a tensor's method."""
        if not _dotted(receiver):
            return False
        none: Collection[QualifiedName] = ()
        names = self.get_metadata(QualifiedNameProvider, receiver, none)
        imports = [q for q in names if q.source is QualifiedNameSource.IMPORT]
        return bool(imports) and all(framework_of(q.name, self.tables) is None for q in imports)

    def _unsupported_call(
        self, original: cst.Call, updated: cst.Call, api: str, why: str
    ) -> cst.BaseExpression:
        """A call the table marks, unless a rule of gluon_loops.py converts it here."""
        predict = None
        if api.endswith(gluon_loops.PREDICT_MODE):
            predict = gluon_loops.predict_mode(original, self._parent)
        if predict is not None:
            self._done(original, api)
            self._full(gluon_loops.PREDICT_HELPER)
            return predict
        self._left(original, api, why)
        return updated

    def _convert_call(
        self, original: cst.Call, updated: cst.Call, found: Resolved
    ) -> cst.BaseExpression:
        entry = found.framework.entries.get(found.name)
        api = found.name
        if default_dtype.is_default_dtype(api, found.framework):
            return self._default_dtype(original, updated, found)
        if entry is None:
            self._left(original, api, found.framework.why_not(api) or NOT_IN_TABLE)
            return updated
        layout = weight_layout.why_not(api, original, self._layer_api, found.framework)
        if entry.unsupported or layout:  # layout: a dim of a weight laid out otherwise
            return self._unsupported_call(original, updated, api, entry.unsupported or layout)
        if entry.kind == "context":
            return self._context(original, updated, api)
        if entry.kind == "remove":
            return self._remove(original, updated, entry, api)
        if entry.kind == "reference":
            self._done(original, api)
            return updated.with_changes(func=self._target_expr(original.func, entry.target))
        if entry.kind == "scheduler" and original not in self._scheduler_of:
            self._left(original, api, SCHEDULER_ALONE)
            return updated
        args = updated.args
        if original in self._lr_of:
            args = _with_argument(args, entry, "learning_rate", self._lr_of[original])
        args = array_functions.numpy_dtypes(entry, original.args, args, self._names)
        in_block = array_functions.in_block_method(original, self._parent, self._gluon_blocks)
        args = array_functions.with_mode(entry, args, in_block)
        try:
            converted = convert_arguments(entry, args, api)
        except NotConverted as exc:
            self._left(original, api, str(exc))
            return updated
        self.needs_root.update(converted.imports)
        if entry.kind == "expression":
            self._done(original, api)
            made = self._table_code(found.framework, converted.target)
            if converted.inits:
                return self._initialised(found.framework, made, converted.inits)
            return self._around(found.framework, made, converted.arounds)
        new_args = converted.args
        if original in self._scheduler_of:
            first = cst.Arg(cst.Name(self._scheduler_of[original]))
            new_args = [first.with_changes(comma=_COMMA) if new_args else first, *new_args]
        call: cst.BaseExpression = updated.with_changes(
            func=self._target_expr(original.func, converted.target), args=new_args
        )
        self._helpers_named(found.framework, code(call))  # an argument's template's helper
        if entry.result:  # the output's shape, as the source's (table.Entry.result)
            call = cst.parse_expression(code(call) + entry.result)
        if converted.inits:  # ``init_parameters(layer, weight=...)``: the table's helper
            call = self._initialised(found.framework, call, converted.inits)
        call = self._around(found.framework, call, converted.arounds)
        self._done(original, api)
        return self._wrapped(found.framework, call, converted.wraps, converted.before)

    def _default_dtype(
        self, original: cst.Call, updated: cst.Call, found: Resolved
    ) -> cst.BaseExpression:
        """``paddle.get_default_dtype()`` where it is a dtype argument (default_dtype.py)."""
        arg = self._parent(original)
        call = self._parent(arg) if arg is not None else None
        func = call.func if isinstance(call, cst.Call) else None
        owner = self._resolve(func) if isinstance(func, cst.Name | cst.Attribute) else None
        target = default_dtype.converted(arg, call, owner.name if owner else None, found.framework)
        target = target or default_dtype.compared(original, arg, call, found.framework)
        if target is None:
            self._left(original, found.name, default_dtype.WHY)
            return updated
        self._done(original, found.name)
        return self._table_code(found.framework, target)

    def _around(
        self, fw: Framework, call: cst.BaseExpression, arounds: Sequence[tuple[str, str]]
    ) -> cst.BaseExpression:
        """The made object passed to each ``around`` helper with its argument's value
        (``with_grad_clip(optimizer, clip)``)."""
        for helper, value in arounds:
            made = [cst.Arg(call), cst.Arg(cst.parse_expression(value))]
            call = cst.Call(self._table_code(fw, helper), made)
        return call

    def _initialised(
        self, fw: Framework, call: cst.BaseExpression, inits: Sequence[tuple[str, str]]
    ) -> cst.BaseExpression:
        """The made layer passed to the framework's init helper with its initializers."""
        values = [
            cst.Arg(self._table_code(fw, v), keyword=cst.Name(k), equal=NO_SPACE) for k, v in inits
        ]
        return cst.Call(self._table_code(fw, fw.init_helper), [cst.Arg(call), *values])

    def _wrapped(
        self,
        fw: Framework,
        call: cst.BaseExpression,
        wraps: Sequence[str],
        before: Sequence[str] = (),
    ) -> cst.BaseExpression:
        if not wraps and not before:
            return call
        first = [cst.Arg(self._table_code(fw, w)) for w in before]
        layers = [cst.Arg(self._table_code(fw, w)) for w in wraps]
        args = [*first, cst.Arg(call), *layers]
        return cst.Call(func=self._table_code(fw, fw.sequential), args=args)

    def _remove(
        self, original: cst.Call, updated: cst.Call, entry: Entry, api: str
    ) -> cst.BaseExpression:
        """The statement that is only this call goes (its arguments must all drop)."""
        expr = self.get_metadata(ParentNodeProvider, original)
        stmt = self.get_metadata(ParentNodeProvider, expr) if isinstance(expr, cst.Expr) else None
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            self._left(original, api, "removed only as a statement of its own")
            return updated
        try:
            convert_arguments(entry, updated.args, api)
        except NotConverted as exc:
            self._left(original, api, str(exc))
            return updated
        self._removed.add(stmt)
        self._done(original, api)
        return updated

    def _hybrid_f(self, receiver: cst.BaseExpression) -> bool:
        """``receiver`` is a parameter that a table names as its framework's module (Gluon's
        ``F``: the mxnet.nd or mxnet.sym a HybridBlock's ``hybrid_forward(self, F, ...)`` is
        given and passes on) of the function it is used in; ``F.softmax(x)`` is a function
        of it, not a tensor's method."""
        names = {fw.module_parameter for fw in self.imported} - {""}
        if not isinstance(receiver, cst.Name) or receiver.value not in names:
            return False
        current = self.get_metadata(ParentNodeProvider, receiver, None)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.get_metadata(ParentNodeProvider, current, None)
        params = current.params.params if current is not None else ()
        return any(p.name.value == receiver.value for p in params)

    def _convert_method(
        self, original: cst.Call, updated: cst.Call, entry: Entry
    ) -> cst.BaseExpression:
        api = entry.source
        assert isinstance(original.func, cst.Attribute) and isinstance(updated.func, cst.Attribute)
        if entry.receivers:
            made_by = self._receiver_api(original.func.value)
            if made_by not in entry.receivers and original not in self._filled:
                if entry.unknown_receiver and made_by != FOREIGN:
                    self._left(original, api, entry.unknown_receiver)
                return updated
        if entry.unsupported:
            self._left(original, api, entry.unsupported)
            return updated
        if entry.kind == "context":
            return self._context(original, updated, api)
        if entry.kind == "remove":
            return self._remove(original, updated, entry, api)
        unpaired = bool(entry.needs_pair) and original not in self._divisor
        if unpaired and not entry.unpaired:
            self._left(original, api, entry.needs_pair)
            return updated
        receiver = _through(original, updated, entry.through)
        try:
            converted = convert_arguments(entry, updated.args, api, code(receiver).strip())
        except NotConverted as exc:
            self._left(original, api, str(exc))
            return updated
        if entry.kind == "expression":
            return self._method_expression(original, api, converted.target, converted.imports)
        stepper = next((f for f in self.imported if gluon_loops.STEP_HELPER in f.helpers), None)
        if converted.moved and original in self._scaled and stepper is not None:
            self._helper(stepper, gluon_loops.STEP_HELPER)  # gluon_loops.py
            self._done(original, api)
            return gluon_loops.step_call(receiver, self._scaled[original])
        if converted.moved and original not in self._paired:
            why = next(a.why for a in entry.args if a.moves)
            self._left(original, api, why)
            return updated
        divisor = self._divisor.get(original)
        if divisor is not None and not _is_one(divisor):
            receiver = cst.parse_expression(f"({code(receiver)} / {code(divisor)})")
        if unpaired or self._shared(original):  # ``gluon_backward(loss)``: the table's helper
            helper = entry.unpaired
            self._helper(next(f for f in self.imported if helper in f.helpers), helper)
            self._done(original, api)
            return cst.Call(cst.Name(helper), [cst.Arg(receiver), *converted.args])
        chain = cst.parse_expression(_RECEIVER + converted.target)
        func = chain.visit(_Receiver(receiver))
        self._done(original, api)
        self._roots_named("".join(code(a) for a in converted.args))
        if entry.then:
            self._then[self._statement(original)] = code(updated.func.value) + entry.then + "()"
        assert isinstance(func, cst.BaseExpression)
        return updated.with_changes(func=func, args=converted.args)

    def _shared(self, backward: cst.Call) -> bool:
        """The module makes several objects of the kind that steps after ``backward`` (two
        Gluon Trainers: a GAN). One backward then reaches parameters another trainer
        steps: Gluon overwrites their gradients (grad_req='write'), PyTorch would add to
        what the other trainer's ``zero_grad()`` did not clear, so the table's helper
        (``gluon_backward``) clears what the loss reaches first."""
        makers = self._stepped_by.get(backward, ())
        return sum(1 for api in self._made_by.values() if api in makers) > 1

    def _method_expression(
        self, original: cst.CSTNode, api: str, text: str, imports: set[str]
    ) -> cst.BaseExpression:
        """A method call replaced by its entry's expression (``$self`` filled in)."""
        self._done(original, api)
        self.needs_root.update(imports)
        self._roots_named(text)
        for fw in self.imported:
            self._helpers_named(fw, text)
        return cst.parse_expression(text)

    def _roots_named(self, written: str) -> None:
        """The target roots (``torch``) that code written into a method's use names: their
        imports are added."""
        self.needs_root.update(
            fw.target_root for fw in self.imported if f"{fw.target_root}." in written
        )

    def _context(self, original: cst.Call, updated: cst.Call, api: str) -> cst.BaseExpression:
        """``with <api>(...):`` whose target is nothing to enter: the body stays, unindented."""
        item = self.get_metadata(ParentNodeProvider, original)
        stmt = None
        if isinstance(item, cst.WithItem) and item.asname is None:
            stmt = self.get_metadata(ParentNodeProvider, item)
        ok = (
            isinstance(stmt, cst.With)
            and len(stmt.items) == 1
            and isinstance(stmt.body, cst.IndentedBlock)
        )
        if not ok:
            self._left(original, api, "removed only as the one item of `with ...:` on its own")
            return updated
        assert stmt is not None
        self._flatten.add(stmt)
        self._done(original, api)
        return updated

    def leave_With(
        self, original: cst.With, updated: cst.With
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if original not in self._flatten:
            return updated
        assert isinstance(updated.body, cst.IndentedBlock)
        body = list(updated.body.body)
        markers = self._markers.pop(original, [])
        head = [*updated.leading_lines, *_comments(markers)]
        first = body[0] if body else None
        if head and isinstance(first, Statement):
            body[0] = first.with_changes(leading_lines=[*head, *first.leading_lines])
        return cst.FlattenSentinel(body)

    def leave_Attribute(
        self, original: cst.Attribute, updated: cst.Attribute
    ) -> cst.BaseExpression:
        if original.attr.value == "weight" and (read := self._transposed_weight(original)):
            return cst.Attribute(updated, cst.Name("mT")) if read == "product" else updated
        entry = self._method(original.attr.value)
        if entry is not None and entry.kind == "attribute" and self._read(original):
            self._done(original, entry.source)
            return self._method_expression(
                original, entry.source, entry.target.replace("$self", code(updated.value)), set()
            )
        return self._reference(original, updated)

    def _read(self, node: cst.Attribute) -> bool:
        """``x.name`` read as a value of ``x``: not called, not a longer name's prefix, not
        assigned to, ``x`` not a module other than the frameworks'."""
        parent = self.get_metadata(ParentNodeProvider, node, None)
        return not (
            node in self._call_funcs
            or (isinstance(parent, cst.Attribute) and parent.value is node)
            or isinstance(parent, cst.AssignTarget | cst.Del)
            or (isinstance(parent, cst.AugAssign) and parent.target is node)
            or self._foreign(node.value)
        )

    def _transposed_weight(self, node: cst.Attribute) -> str:
        """``linear.weight`` of a layer made here whose weight is the PyTorch layer's
        transpose (Paddle's Linear: [in, out]; PyTorch's: [out, in]): marked, the layout
        being what the use decides (a product wants ``.T``, an initializer the tensor),
        unless transposed_reads knows the use: "product" (read as ``.mT``), "reduced"."""
        api = self._made_by.get(self._receiver_key(node.value))
        fw = next((fw for fw in self.imported if api is not None and api in fw.transposed), None)
        if fw is None:
            return ""
        if transposed_reads.in_product(node, self._parent, self._qualified, fw.root):
            self._done(node, f"{api}.weight")
            return "product"
        if transposed_reads.reduced(node, self._parent):
            self._done(node, f"{api}.weight")
            return "reduced"
        self._left(node, f"{api}.weight", TRANSPOSED)
        return ""

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self._reference(original, updated)

    def _reference(
        self, original: cst.Attribute | cst.Name, updated: cst.BaseExpression
    ) -> cst.BaseExpression:
        """A framework name used as a value (a base class, a dtype), not called."""
        if original in self._call_funcs:
            return updated
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if isinstance(parent, cst.Attribute) and parent.value is original:
            return updated  # a prefix of a longer name: the longer name decides
        value = getattr(parent, "default" if isinstance(parent, cst.Param) else "value", None)
        if isinstance(parent, cst.Attribute | cst.Arg | cst.Param) and original is not value:
            return updated  # an attribute's name or a keyword, not a value (a default is)
        found = self._resolve(original)
        if found is None or self._dropped_argument(original):
            return updated  # not the framework's, or an argument its call's entry drops
        entry = found.framework.entries.get(found.name)
        if entry is None:
            self._left(original, found.name, found.framework.why_not(found.name) or NOT_IN_TABLE)
            return updated
        as_type = _as_type(entry) and self._type_use(original)
        if entry.kind != "reference" and not as_type and not entry.value:
            why = entry.unsupported or "used without a call: its arguments cannot be converted"
            self._left(original, found.name, why)
            return updated
        self._done(original, found.name)
        value = entry.value if entry.kind != "reference" and not as_type else entry.target
        return self._target_expr(original, value)

    def _type_use(self, node: cst.CSTNode) -> bool:
        """``node`` is compared (``type(m) == nn.Linear``) or is the type ``isinstance`` /
        ``issubclass`` checks against (alone or in a tuple), or an annotation: a class, not
        a call."""
        if self._annotation(node):
            return True
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Comparison | cst.ComparisonTarget):
            return True
        if isinstance(parent, cst.Element):
            parent = self.get_metadata(ParentNodeProvider, parent, None)
            if not isinstance(parent, cst.Tuple):
                return False
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        if not isinstance(parent, cst.Arg):
            return False
        call = self.get_metadata(ParentNodeProvider, parent, None)
        return (
            isinstance(parent, cst.Arg)
            and isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value in ("isinstance", "issubclass")
            and len(call.args) == 2
            and call.args[1] is parent
        )

    def _annotation(self, node: cst.CSTNode) -> bool:
        """``node`` is a type annotation or inside one (``x: nn.Embedding``,
        ``-> Optional[Tuple[paddle.Tensor]]``, ``A | None``)."""
        current = self.get_metadata(ParentNodeProvider, node, None)
        while isinstance(current, _TYPE_PARTS):
            current = self.get_metadata(ParentNodeProvider, current, None)
        return isinstance(current, cst.Annotation)

    def leave_BinaryOperation(
        self, original: cst.BinaryOperation, updated: cst.BinaryOperation
    ) -> cst.BaseExpression:
        """``a.parameters() + b.parameters()``: lists in the source, iterators in PyTorch."""
        if not isinstance(updated.operator, cst.Add):
            return updated
        names = {m.lstrip(".") for fw in self.imported for m in fw.list_methods}
        listed = [_call_of(side, names) for side in (updated.left, updated.right)]
        if not any(listed):
            return updated
        left, right = (
            cst.Call(cst.Name("list"), [cst.Arg(side)]) if wrap else side
            for side, wrap in zip((updated.left, updated.right), listed, strict=True)
        )
        return updated.with_changes(left=left, right=right)

    # -- statements left whole -------------------------------------------------------------

    def _position(self, node: cst.CSTNode) -> tuple[int, int]:
        where: CodeRange = self.get_metadata(PositionProvider, node)
        return where.start.line, where.start.column

    def on_visit(self, node: cst.CSTNode) -> bool:
        """A statement the last pass failed on (``skip``) is not entered: it stays as it
        was, under a marker; the others are tracked so a failure can name its statement."""
        if isinstance(node, Statement):
            at = self._position(node)
            error = self.skip.get(at)
            if error is not None:
                why = FAILED.format(error=error)
                self.uses.append(Use(at[0], STATEMENT, why))
                self._markers.setdefault(node, []).append(MARKER.format(api=STATEMENT, why=why))
                return False
            self.inside.append(at)
        return super().on_visit(node)

    # -- in-place updates by a gradient -----------------------------------------------------

    def _grad_update(self, stmt: cst.CSTNode) -> bool:
        """``param[:] = param - lr * param.grad`` or ``w -= lr * w.grad``: an array updated
        in place by a gradient, which the source does outside recording and PyTorch
        refuses on a leaf that needs a gradient unless no gradient is recorded."""
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            return False
        if not any(fw.grad_update for fw in self.imported):
            return False
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value = small.targets[0].target, small.value
            in_place = isinstance(target, cst.Subscript)
        elif isinstance(small, cst.AugAssign):
            target, value = small.target, small.value
            in_place = isinstance(target, cst.Subscript | cst.Name)
        else:
            return False
        return in_place and ".grad" in code(value) and not self._in_with(stmt)

    def _in_with(self, node: cst.CSTNode) -> bool:
        """``node`` is inside a ``with`` block of its function (``autograd.record()``
        records there)."""
        current = self.get_metadata(ParentNodeProvider, node, None)
        while current is not None:
            if isinstance(current, cst.With):
                return True
            if isinstance(current, cst.FunctionDef | cst.ClassDef):
                return False
            current = self.get_metadata(ParentNodeProvider, current, None)
        return False

    def _unrecorded(self, stmt: cst.SimpleStatementLine) -> cst.With:
        """``stmt`` in the table's context (``with torch.no_grad():``)."""
        context = next(fw.grad_update for fw in self.imported if fw.grad_update)
        self._roots_named(context)
        inner = stmt.with_changes(leading_lines=[])
        return cst.With(
            items=[cst.WithItem(cst.parse_expression(context))],
            body=cst.IndentedBlock(body=[inner]),
            leading_lines=stmt.leading_lines,
        )

    # -- markers --------------------------------------------------------------------------

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        result = self._leave(original_node, updated_node)
        if isinstance(original_node, Statement) and self.inside:
            at = self._position(original_node)
            if self.inside[-1] == at:  # popped only once left without an error
                self.inside.pop()
        return result

    def _leave(
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        result = super().on_leave(original_node, updated_node)
        if original_node in self._removed:
            return cst.RemoveFromParent()
        if isinstance(result, cst.SimpleStatementLine) and self._grad_update(original_node):
            result = self._unrecorded(result)
        then = self._then.pop(original_node, None)
        if then is not None and isinstance(result, cst.SimpleStatementLine):
            added = cst.parse_statement(then)
            result = cst.FlattenSentinel([result, added])
            self._made[original_node] = list(result.nodes)
            return result
        markers = self._markers.pop(original_node, None)
        if markers and isinstance(result, Statement):
            known = {line.comment.value for line in result.leading_lines if line.comment}
            fresh = [m for m in dict.fromkeys(markers) if m not in known]
            result = result.with_changes(leading_lines=[*result.leading_lines, *_comments(fresh)])
        if isinstance(original_node, Statement):
            made = result.nodes if isinstance(result, cst.FlattenSentinel) else [result]
            self._made[original_node] = [n for n in made if isinstance(n, cst.CSTNode)]
        return result


_ATOMS = (
    cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.SimpleString, cst.ConcatenatedString,
    cst.FormattedString, cst.Integer, cst.Float, cst.Imaginary, cst.List, cst.Dict, cst.Set,
    cst.ListComp, cst.DictComp, cst.SetComp, cst.GeneratorExp, cst.Ellipsis,
)  # fmt: skip
_LOOSE = (
    cst.Arg, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Expr, cst.Element,
    cst.DictElement, cst.WithItem, cst.Yield,
)  # fmt: skip  # places where an operation needs no parentheses
_TYPE_PARTS = (
    cst.Subscript, cst.SubscriptElement, cst.Index, cst.Element, cst.Tuple, cst.List,
    cst.BinaryOperation,
)  # fmt: skip  # what a type in an annotation may be nested in


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


def _dotted(node: cst.CSTNode) -> bool:
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _argument(call: cst.Call, entry: Entry, name: str) -> cst.Arg | None:
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
    arg = _argument(call, entry, "learning_rate")
    if arg is not None:
        return arg.value
    spec = entry.arg("learning_rate")
    return None if spec is None or spec.default is None else cst.parse_expression(spec.default)


def _with_argument(
    args: Sequence[cst.Arg], entry: Entry, name: str, value: cst.BaseExpression
) -> list[cst.Arg]:
    index = next((i for i, a in enumerate(entry.args) if a.name == name), None)
    out = []
    for i, arg in enumerate(args):
        named = arg.keyword is not None and arg.keyword.value == name
        if named or (arg.keyword is None and i == index):
            arg = arg.with_changes(value=value)
        out.append(arg)
    return out


def _comments(texts: Iterable[str]) -> list[cst.EmptyLine]:
    return [cst.EmptyLine(indent=True, comment=cst.Comment(t)) for t in dict.fromkeys(texts)]


class _Receiver(cst.CSTTransformer):
    """Puts a method call's receiver where the table's target chain has its placeholder."""

    def __init__(self, receiver: cst.BaseExpression) -> None:
        super().__init__()
        self.receiver = receiver

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.receiver if updated.value == _RECEIVER else updated
