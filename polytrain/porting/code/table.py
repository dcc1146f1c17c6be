"""The mapping table of ``polytrain port-code``: one entry per source API, read from the
TOML files beside this module (data, not code: the core names no framework in code).

A file holds one source framework: ``[framework]`` (its import root, the target's root,
the module equivalents that keep an import alias) and ``[[api]]`` entries. An entry maps a
call (``paddle.nn.Linear``), a reference (``paddle.nn.Layer``, ``paddle.float32``) or a
method (``.clear_grad``, any receiver) to its target, with the argument transformation,
the semantics rule where the frameworks differ, and an example its test runs."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError

TABLE_DIR = Path(__file__).parent
ANY = "*"  # in ``drop``: any value is dropped (it does not change a number)
ARG_KEYS = {
    "name", "to", "drop", "convert", "template", "default", "why", "wrap", "others", "edits",
    "before", "need", "spread", "moves", "init", "around",
}  # fmt: skip
KINDS = (
    "call", "reference", "method", "context", "scheduler", "remove", "expression", "attribute",
)  # fmt: skip


@dataclass(frozen=True)
class Arg:
    """One source parameter, in the source's positional order.

    ``to``: the target keyword ("" = the same name; None: dropped). ``drop``: source values
    (Python literals as code, or ``*``) the target has no argument for and behaves as;
    ``convert``: source literal -> target code; ``template``: target code around the value
    (``1 - {}``); ``default``: target code written when the source omits the argument
    (the defaults differ); ``why``: why any other value cannot be converted; ``wrap``: the
    converted value is a layer that follows the call (``act="relu"``); ``others``: values
    not listed pass as they are. A ``to`` of ``name.0`` / ``name.1`` builds one target
    tuple from two source arguments (Adam's ``beta1``, ``beta2`` -> ``betas``); each part
    then needs its ``default``. ``edits``: source literal -> (another source argument,
    target code around that argument's value): ``transpose_y=True`` makes ``y`` ``y.mT``
    and is itself dropped. ``default`` may be a table by target name (``target_by``).
    ``before``: the converted value is a layer that precedes the call (Gluon's ``Dense``
    flattens its input first). ``need``: the argument must be given (why, when not).
    ``spread``: the value is a dict display whose string keys are more keyword arguments
    of the entry (Gluon's ``optimizer_params``). A name starting with ``*`` takes every
    remaining positional argument, written as one list. ``moves``: the value leaves the
    call for the paired statement (the batch size of Gluon's ``trainer.step``). ``init``:
    the value (a converted initializer: a function of the tensor, or None) sets the made
    layer's parameter of that name, through the framework's ``init_helper``; a literal
    listed in ``convert`` is a keyword as usual (``bias_attr=False``). ``around``: a helper
    the made object is passed to with the value, ``helper(made, value)``, where the value is
    given and not dropped (an optimizer's ``grad_clip``); an argument that is also passed
    on (``to``) goes through it only where it is not a literal (a learning rate that may be
    a schedule), and one with a ``why`` too (a literal other than those dropped is marked:
    ``data_format='NHWC'``; a variable is checked by the helper when the code runs)."""

    name: str
    to: str | None = ""
    drop: tuple[str, ...] = ()
    convert: Mapping[str, str] = field(default_factory=dict)
    template: str | None = None
    default: str | None = None
    why: str = ""
    wrap: bool = False
    others: bool = False
    edits: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    default_for: Mapping[str, str] = field(default_factory=dict)
    before: bool = False
    need: str = ""
    spread: bool = False
    moves: bool = False
    init: str = ""
    around: str = ""

    @property
    def packs(self) -> bool:
        return self.name.startswith("*")

    @property
    def target_name(self) -> str | None:
        if self.to is None:
            return None
        return self.to or self.name


@dataclass(frozen=True)
class Entry:
    """One API: ``source`` (qualified name, or ``.name`` for a method), ``target`` (empty
    when the API is known but not converted: ``unsupported`` says why).

    A method with ``receivers`` is converted only on a receiver assigned from a call of
    one of those APIs in the module (``net = nn.Sequential()``; ``net.add``); on another
    receiver it is marked with ``unknown_receiver`` or, when that is empty, left alone
    (``seen.add(x)`` on a set). ``then``: a method called on the same receiver in a
    statement added after (``trainer.zero_grad()``). ``needs_pair``: converted only as the
    statement an argument ``moves`` to (``loss.backward()`` before ``trainer.step(n)``),
    else marked with this reason. ``kind = "remove"``: the statement that is only this
    call goes (``net.hybridize()``). ``result``: code appended to the converted call, for
    an output whose shape differs (``.unsqueeze(-1)``: fluid's per-sample loss is [N, 1]).
    ``unpaired``: a helper of the table (``[framework.helpers]``) a ``needs_pair`` method
    becomes where no pair is found, called with the receiver and the arguments
    (``gluon_backward(loss)``); the helper is then defined in the converted file.
    ``kind = "expression"``: the use becomes ``target`` itself, code in which ``$name`` is
    the argument's value (its ``default`` when absent) and ``$self`` a method's receiver
    (``$loss / torch.distributed.get_world_size()``); every argument kept must appear.
    ``called``: what a call without arguments of an object this API made in the module
    becomes, ``$self`` being the object (Paddle's loaders are called, ``loader()``, where
    PyTorch's are iterated: ``$self``). ``through``: a method whose receiver may be that
    method's result on the object meant (``net.collect_params().initialize()`` is
    ``net.initialize()`` in Gluon): converted on the object. ``kind = "attribute"``: a
    method-table name read without a call (``y.size``), replaced by ``target`` with
    ``$self`` the object. ``value``: what a call entry's API becomes where it is used as
    a value, not called (``func=mx.nd.zeros``: ``torch.zeros``). ``subclass_kwargs``: the
    helper a class derived from this one gives the keyword arguments of its
    ``super().__init__(...)`` to (Gluon's ``prefix=``: blocks.py). ``passes_kwargs``: a
    ``**mapping`` argument is passed on as it is: the target (a helper written with the
    source's signature) takes every source keyword by its own name."""

    source: str
    target: str
    kind: str = "call"
    args: tuple[Arg, ...] = ()
    positional: tuple[str, ...] = ()
    target_by: tuple[str, Mapping[str, str], bool] | None = None
    rule: str = ""
    note: str = ""
    unsupported: str = ""
    example: str = ""
    stand_in: str = ""
    check: str = "value"
    inputs: Mapping[str, str] = field(default_factory=dict)
    tolerance: float | None = None
    differs: tuple[str, ...] = ()
    receivers: tuple[str, ...] = ()
    unknown_receiver: str = ""
    then: str = ""
    needs_pair: str = ""
    result: str = ""
    unpaired: str = ""
    called: str = ""
    through: str = ""
    value: str = ""
    subclass_kwargs: str = ""
    passes_kwargs: bool = False

    @property
    def is_method(self) -> bool:
        return self.source.startswith(".")

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.args if a.name == name), None)


@dataclass(frozen=True)
class Framework:
    """A source framework's table: its import root, the target's, the module equivalents
    (an alias of a source module becomes an alias of its target module), what a wrapped
    layer is wrapped in, and the entries by source name. ``helpers``: functions or classes
    (name -> their code) a converted use may call; each one used is defined in the converted
    file, with the helpers its code names. ``grad_update``: the context manager an in-place
    update of an array by a gradient (``param[:] = param - lr * param.grad``, done outside
    recording in the source) runs in. ``transposed``: layers whose ``.weight`` is the
    transpose of the PyTorch layer's (Paddle's Linear: [in, out]); a use of it is marked.
    ``list_methods``: methods whose result is a list
    in the source and an iterator in PyTorch (``.parameters``): ``a + b`` of them is
    written ``list(a) + list(b)``."""

    name: str
    root: str
    target_root: str
    modules: Mapping[str, str]
    sequential: str
    entries: Mapping[str, Entry]
    methods: Mapping[str, Entry]
    same: Mapping[str, str] = field(default_factory=dict)
    helpers: Mapping[str, str] = field(default_factory=dict)
    list_methods: tuple[str, ...] = ()  # return a list in the source, an iterator in PyTorch
    init_helper: str = ""  # the helper that sets a made layer's parameters (Arg.init)
    transposed: tuple[str, ...] = ()  # layers whose weight is the PyTorch weight's transpose
    grad_update: str = ""  # the context an in-place update by a gradient runs in (no_grad)
    module_parameter: str = ""  # a parameter that is the framework's module (Gluon's ``F``)
    module_parameter_as: str = ""  # the module whose entries convert ``F.x`` (mxnet.nd)
    layer_classes: tuple[str, ...] = ()  # a subclass's ``self`` is a layer (layer_self.py)
    unconverted: Mapping[str, str] = field(default_factory=dict)  # module -> why none is

    def why_not(self, name: str) -> str:
        """Why no API of ``name``'s module is converted (``[framework.unconverted]``: a
        module with no line-by-line PyTorch equivalent), or ''."""
        found = (w for m, w in self.unconverted.items() if f"{name}.".startswith(f"{m}."))
        return next(found, "")

    def canonical(self, name: str) -> str:
        """``name`` with a module synonym replaced (``mxnet.ndarray.zeros`` is
        ``mxnet.nd.zeros``)."""
        for prefix, replacement in self.same.items():
            if name == prefix or name.startswith(prefix + "."):
                return replacement + name[len(prefix) :]
        return name


def literal(code: str) -> Any:
    """The value of a Python literal written as code (a ConfigError when it is not one)."""
    try:
        return ast.literal_eval(code)
    except (ValueError, SyntaxError) as exc:
        raise ConfigError(f"{code!r} in the port-code table is not a Python literal.") from exc


def _arg(raw: str | Mapping[str, Any], where: str) -> Arg:
    if isinstance(raw, str):
        return Arg(raw)
    unknown = set(raw) - ARG_KEYS
    if unknown or "name" not in raw:
        raise ConfigError(f"{where}: bad argument entry {dict(raw)} ({sorted(unknown)}).")
    to = raw.get("to", "")
    drop = tuple(raw.get("drop", ()))
    edits = {key: (str(v[0]), str(v[1])) for key, v in raw.get("edits", {}).items()}
    for code in (*(d for d in drop if d != ANY), *raw.get("convert", {}), *edits):
        literal(code)
    default = raw.get("default")
    return Arg(
        name=raw["name"],
        to=None if to == "-" else to,
        drop=drop,
        convert=dict(raw.get("convert", {})),
        template=raw.get("template"),
        default=default if isinstance(default, str | None) else None,
        default_for=dict(default) if isinstance(default, Mapping) else {},
        before=bool(raw.get("before", False)),
        need=raw.get("need", ""),
        spread=bool(raw.get("spread", False)),
        moves=bool(raw.get("moves", False)),
        init=raw.get("init", ""),
        around=raw.get("around", ""),
        why=raw.get("why", ""),
        wrap=bool(raw.get("wrap", False)),
        others=bool(raw.get("others", False)),
        edits=edits,
    )


def _entry(raw: Mapping[str, Any]) -> Entry:
    where = f"port-code table entry {raw.get('source', '?')}"
    known = set(Entry.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown or "source" not in raw:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}.")
    kind = raw.get("kind", "method" if raw["source"].startswith(".") else "call")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}.")
    if kind == "expression":
        _check_expression(raw, where)
    target_by = None
    if "target_by" in raw:
        by = raw["target_by"]
        target_by = (by["name"], dict(by["map"]), bool(by.get("keep", False)))
    return Entry(
        source=raw["source"],
        target=raw.get("target", ""),
        kind=kind,
        args=tuple(_arg(a, where) for a in raw.get("args", ())),
        positional=tuple(raw.get("positional", ())),
        target_by=target_by,
        rule=raw.get("rule", ""),
        note=raw.get("note", ""),
        unsupported=raw.get("unsupported", ""),
        example=raw.get("example", ""),
        stand_in=raw.get("stand_in", ""),
        check=raw.get("check", "value"),
        inputs=dict(raw.get("inputs", {})),
        tolerance=raw.get("tolerance"),
        differs=tuple(raw.get("differs", ())),
        receivers=tuple(raw.get("receivers", ())),
        unknown_receiver=raw.get("unknown_receiver", ""),
        then=raw.get("then", ""),
        needs_pair=raw.get("needs_pair", ""),
        result=raw.get("result", ""),
        unpaired=raw.get("unpaired", ""),
        called=raw.get("called", ""),
        through=raw.get("through", ""),
        value=raw.get("value", ""),
        subclass_kwargs=raw.get("subclass_kwargs", ""),
        passes_kwargs=bool(raw.get("passes_kwargs", False)),
    )


def _check_expression(raw: Mapping[str, Any], where: str) -> None:
    """An expression entry names each argument it keeps (one left out would vanish)."""
    target = raw.get("target", "")
    for a in raw.get("args", ()):
        name = (a if isinstance(a, str) else a.get("name", "")).lstrip("*")
        kept = isinstance(a, str) or a.get("to", "") != "-"
        if kept and f"${name}" not in target:
            raise ConfigError(f"{where}: the expression does not use the argument `{name}`.")


def _helpers(raw: Mapping[str, str], where: str) -> dict[str, str]:
    """``[framework.helpers]``: each is the code of one function or class of that name."""
    for name, text in raw.items():
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            raise ConfigError(f"{where}: helper {name} does not parse ({exc.msg}).") from exc
        defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        if defs != [name] or len(tree.body) != 1:
            raise ConfigError(f"{where}: helper {name} must be one function or class {name}.")
    return dict(raw)


def load_framework(path: Path) -> Framework:
    """One table file."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    head = data["framework"]
    entries: dict[str, Entry] = {}
    methods: dict[str, Entry] = {}
    for raw in data.get("api", ()):
        entry = _entry(raw)
        book = methods if entry.is_method else entries
        if entry.source in book:
            raise ConfigError(f"{path.name}: {entry.source} is in the table twice.")
        book[entry.source] = entry
    helpers = _helpers(head.get("helpers", {}), path.name)
    for entry in (*entries.values(), *methods.values()):
        if entry.unpaired and entry.unpaired not in helpers:
            raise ConfigError(f"{path.name}: {entry.source}: no helper {entry.unpaired}.")
        if entry.subclass_kwargs and entry.subclass_kwargs not in helpers:
            raise ConfigError(f"{path.name}: {entry.source}: no helper {entry.subclass_kwargs}.")
    return Framework(
        name=head["name"],
        root=head["root"],
        target_root=head["target_root"],
        modules=dict(head.get("modules", {})),
        sequential=head.get("sequential", ""),
        entries=entries,
        methods=methods,
        same=dict(head.get("same", {})),
        helpers=helpers,
        list_methods=tuple(head.get("list_methods", ())),
        transposed=tuple(head.get("transposed", ())),
        grad_update=head.get("grad_update", ""),
        init_helper=head.get("init_helper", ""),
        module_parameter=head.get("module_parameter", ""),
        module_parameter_as=head.get("module_parameter_as", ""),
        layer_classes=tuple(head.get("layer_classes", ())),
        unconverted=dict(head.get("unconverted", {})),
    )


@cache
def frameworks() -> dict[str, Framework]:
    """Every table, by source import root."""
    found = [load_framework(p) for p in sorted(TABLE_DIR.glob("*.toml"))]
    merged: dict[str, Framework] = {}
    for fw in found:  # several files may hold one framework (e.g. its 1.x API)
        merged[fw.root] = merge(merged[fw.root], fw) if fw.root in merged else fw
    return merged


def merge(old: Framework, fw: Framework) -> Framework:
    """Two tables of one framework as one: every field of both (an API in both refused)."""
    twice = (set(old.entries) & set(fw.entries)) | (set(old.methods) & set(fw.methods))
    if twice:
        raise ConfigError(f"{sorted(twice)[0]} is in two port-code tables.")
    return Framework(
        old.name, old.root, old.target_root, {**old.modules, **fw.modules},
        old.sequential or fw.sequential, {**old.entries, **fw.entries},
        {**old.methods, **fw.methods}, {**old.same, **fw.same},
        {**old.helpers, **fw.helpers}, (*old.list_methods, *fw.list_methods),
        old.init_helper or fw.init_helper, (*old.transposed, *fw.transposed),
        old.grad_update or fw.grad_update, old.module_parameter or fw.module_parameter,
        old.module_parameter_as or fw.module_parameter_as,
        (*old.layer_classes, *fw.layer_classes), {**old.unconverted, **fw.unconverted},
    )  # fmt: skip


def all_entries(root: str | None = None) -> list[Entry]:
    """Every entry of every table (of the framework imported as ``root``), calls and
    references first, then methods."""
    out: list[Entry] = []
    for fw in frameworks().values():
        if root is None or fw.root == root:
            out.extend(fw.entries.values())
            out.extend(fw.methods.values())
    return out
