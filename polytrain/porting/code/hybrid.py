"""Gluon's ``hybrid_forward(self, F, x, ...)`` as PyTorch's ``forward(self, x, ...)``.

``F`` is the module (``mxnet.nd`` or ``mxnet.sym``) Gluon passes to a HybridBlock's
``hybrid_forward``; the block passes it on to its helpers (``_masked_softmax(F, x)``). In
every function that receives it that way, ``F.x`` is the table's ``module_parameter_as``
module's ``x`` (``mxnet.nd.x``), converted by its entry; the parameter goes from the
definitions and from the calls that pass it on; ``hybrid_forward`` is named ``forward``;
the block's parameters (``self.w = self.params.get('w', ...)``), which Gluon passes to it
as keyword arguments, are read from ``self``. A use of ``F`` the tool cannot follow (given
to a function it does not see) is marked."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from polytrain.porting.code import hybrid_overrides

HYBRID = "hybrid_forward"
PASSED_ON = (
    "`F` (mxnet.nd or mxnet.sym, which Gluon passes to `hybrid_forward`) is given to code "
    "the tool does not see: the converted `forward` has no `F`; call torch's functions there"
)
PARAMETER = (
    "a Gluon Parameter (`self.params.get`): write `torch.nn.Parameter(torch.empty(shape))` "
    "and initialise it as the `init` says"
)
_PARAMS_GETTERS = ("get", "get_constant")


@dataclass
class _Def:
    node: cst.FunctionDef
    cls: cst.ClassDef | None
    index: int  # the position of F among the parameters a caller gives (self not counted)


@dataclass
class Hybrid:
    """What one module's functions that receive ``F`` as Gluon's module are."""

    param: str = ""
    defs: dict[cst.FunctionDef, _Def] = field(default_factory=dict)
    heads: set[cst.Name] = field(default_factory=set)  # the F of ``F.x`` in those functions
    drops: dict[cst.Call, int] = field(default_factory=dict)  # call -> F's argument index
    renames: set[cst.Call] = field(default_factory=set)  # ``self.hybrid_forward(F, ...)``
    bare: list[cst.Name] = field(default_factory=list)  # an F the tool cannot follow
    block_params: dict[cst.FunctionDef, list[str]] = field(default_factory=dict)
    getters: list[cst.Call] = field(default_factory=list)  # ``self.params.get(...)`` calls

    def head(self, node: cst.CSTNode) -> cst.Name | None:
        """The ``F`` that ``node`` (``F.x.y``) starts with, when it is Gluon's module."""
        while isinstance(node, cst.Attribute):
            node = node.value
        return node if isinstance(node, cst.Name) and node in self.heads else None

    def leave_def(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        """The definition without ``F``; ``hybrid_forward`` named ``forward``, the block's
        parameters read from ``self``."""
        found = self.defs.get(original)
        if found is None:
            return updated
        params = [p for p in updated.params.params if p.name.value != self.param]
        declared = self.block_params.get(original, [])
        kept = [p for p in params if p.name.value not in declared]
        more = updated.params.kwonly_params or any(
            isinstance(p, cst.CSTNode) for p in (updated.params.star_arg, updated.params.star_kwarg)
        )
        if kept and not more and len(kept) < len(updated.params.params):
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        made = updated.with_changes(params=updated.params.with_changes(params=kept))
        if original.name.value == HYBRID and found.cls is not None:
            made = made.with_changes(name=cst.Name("forward"))
        reads = [p for p in params if p.name.value in declared]
        return _with_reads(made, reads) if reads else made

    def leave_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """The call without the ``F`` it passed on (``hybrid_forward`` named ``forward``)."""
        index = self.drops.get(original)
        if index is None:
            return updated
        args = [a for i, a in enumerate(updated.args) if i != index]
        if args and index == len(updated.args) - 1:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        func = updated.func
        if original in self.renames and isinstance(func, cst.Attribute):
            func = func.with_changes(attr=cst.Name("forward"))
        return updated.with_changes(func=func, args=args)


def find(module: cst.Module, param: str) -> Hybrid:
    """The functions of ``module`` that receive ``param`` as Gluon's module: each
    ``hybrid_forward(self, F, ...)`` of a class, and each function one of them passes its
    ``F`` to (by name, in this module), and so on."""
    out = Hybrid(param)
    if not param:
        return out
    every = _definitions(module, param)
    pending = [d for d in every if d.node.name.value == HYBRID and d.cls is not None]
    pending = [d for d in pending if d.index == 0]
    while pending:
        current = pending.pop()
        if current.node in out.defs:
            continue
        out.defs[current.node] = current
        for call, index, callee in _passes(current, every, param, out):
            out.drops[call] = index
            if callee.node not in out.defs:
                pending.append(callee)
            pending.extend(hybrid_overrides.overrides(call, callee, every, module))
    for d in out.defs.values():
        _uses(d.node, param, out)
    _declared(module, out)
    return out


def _definitions(module: cst.Module, param: str) -> list[_Def]:
    """Every function with a parameter ``param`` (F), with its class and F's position."""
    found: list[_Def] = []

    class Finder(cst.CSTVisitor):
        def __init__(self) -> None:
            self.classes: list[cst.ClassDef] = []

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            self.classes.append(node)

        def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
            self.classes.pop()

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            names = [p.name.value for p in node.params.params]
            if param not in names:
                return
            cls = self.classes[-1] if self.classes and _method_of(node, self.classes[-1]) else None
            index = names.index(param) - (1 if cls is not None else 0)
            found.append(_Def(node, cls, index))

    module.visit(Finder())
    return found


def _method_of(node: cst.FunctionDef, cls: cst.ClassDef) -> bool:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
    return node in body


def _calls(node: cst.CSTNode) -> Iterator[cst.Call]:
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

    node.visit(Finder())
    yield from found


def _passes(
    current: _Def, every: Sequence[_Def], param: str, out: Hybrid
) -> Iterator[tuple[cst.Call, int, _Def]]:
    """The calls in ``current`` that give its F to a function of the module at that
    function's F position: (call, the argument's index, the callee)."""
    for call in _calls(current.node.body):
        index = next((i for i, a in enumerate(call.args) if _is_f(a, param)), None)
        if index is None or any(a.star for a in call.args[:index]):
            continue
        callee = _callee(call, current, every)
        if callee is not None and callee.index == index:
            if callee.node.name.value == HYBRID:
                out.renames.add(call)
            yield call, index, callee


def _is_f(arg: cst.Arg, param: str) -> bool:
    return (
        arg.keyword is None
        and not arg.star
        and isinstance(arg.value, cst.Name)
        and arg.value.value == param
    )


def _callee(call: cst.Call, current: _Def, every: Sequence[_Def]) -> _Def | None:
    """The function of the module ``call`` calls: ``name(...)`` a module-level one,
    ``self.name(...)`` a method of the caller's class, ``super(...).name(...)`` one of
    its first base when the module defines that class."""
    func = call.func
    if isinstance(func, cst.Name):
        return next((d for d in every if d.cls is None and d.node.name.value == func.value), None)
    if not isinstance(func, cst.Attribute) or current.cls is None:
        return None
    name = func.attr.value
    owner: str | None = None
    if isinstance(func.value, cst.Name) and func.value.value == "self":
        owner = current.cls.name.value
    elif isinstance(func.value, cst.Call) and _is_name(func.value.func, "super"):
        bases = current.cls.bases
        owner = _base_name(bases[0].value) if bases else None
    if owner is None:
        return None
    return next(
        (d for d in every if d.cls is not None and d.cls.name.value == owner
         and d.node.name.value == name),
        None,
    )  # fmt: skip


def _is_name(node: cst.BaseExpression, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _base_name(node: cst.BaseExpression) -> str | None:
    return node.value if isinstance(node, cst.Name) else None


def _uses(node: cst.FunctionDef, param: str, out: Hybrid) -> None:
    """Each ``F`` in ``node``'s body: the head of ``F.x``, an argument dropped, or bare."""
    dropped = {call.args[i].value for call, i in out.drops.items()}

    names: set[cst.Name] = set()  # an attribute's or a keyword's name, not a value

    class Finder(cst.CSTVisitor):
        def visit_Attribute(self, attr: cst.Attribute) -> None:
            names.add(attr.attr)
            if _is_name(attr.value, param):
                assert isinstance(attr.value, cst.Name)
                out.heads.add(attr.value)

        def visit_Arg(self, arg: cst.Arg) -> None:
            if arg.keyword is not None:
                names.add(arg.keyword)

        def visit_Name(self, name: cst.Name) -> None:
            if name.value == param and name not in out.heads | names | dropped:
                out.bare.append(name)

        def visit_FunctionDef(self, inner: cst.FunctionDef) -> bool:
            names = {p.name.value for p in inner.params.params}
            return param not in names  # a nested function with its own F: its own

    for statement in _body(node):
        statement.visit(Finder())
    out.bare = [n for n in out.bare if n not in out.heads]


def _body(node: cst.FunctionDef) -> Sequence[cst.CSTNode]:
    return node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]


def _declared(module: cst.Module, out: Hybrid) -> None:
    """The block parameters of each class (``self.w = self.params.get('w', ...)``) that
    its ``hybrid_forward`` takes by name."""
    for d in out.defs.values():
        if d.cls is None or d.node.name.value != HYBRID:
            continue
        names = set(_getter_targets(d.cls, out))
        taken = [p.name.value for p in d.node.params.params]
        out.block_params[d.node] = [n for n in taken if n in names]


def _getter_targets(cls: cst.ClassDef, out: Hybrid) -> Iterator[str]:
    found: list[str] = []

    class Finder(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if not (isinstance(node.value, cst.Call) and _params_getter(node.value)):
                return
            out.getters.append(node.value)
            for t in node.targets:
                target = t.target
                if isinstance(target, cst.Attribute) and _is_name(target.value, "self"):
                    found.append(target.attr.value)

    cls.visit(Finder())
    yield from found


def _params_getter(call: cst.Call) -> bool:
    """``self.params.get(...)`` / ``self.params.get_constant(...)``."""
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value in _PARAMS_GETTERS
        and isinstance(func.value, cst.Attribute)
        and func.value.attr.value == "params"
        and _is_name(func.value.value, "self")
    )


def _with_reads(node: cst.FunctionDef, params: Sequence[cst.Param]) -> cst.FunctionDef:
    """``name = self.name`` for each parameter, at the top of the body (after a
    docstring); ``getattr(self, 'name', default)`` for one with a default (Gluon passes
    only the parameters the block made: ``if means: self.means = self.params.get(...)``)."""
    assert isinstance(node.body, cst.IndentedBlock)
    body = list(node.body.body)
    at = 1 if body and _docstring(body[0]) else 0
    reads = [cst.parse_statement(_read(p)) for p in params]
    return node.with_changes(body=node.body.with_changes(body=[*body[:at], *reads, *body[at:]]))


def _docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _read(param: cst.Param) -> str:
    name = param.name.value
    if param.default is None:
        return f"{name} = self.{name}"
    return f"{name} = getattr(self, {name!r}, {cst.Module([]).code_for_node(param.default)})"
