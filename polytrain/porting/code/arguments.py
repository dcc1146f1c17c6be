"""A call's arguments rewritten by a table entry: bound to the source's parameters, then
renamed, reordered, dropped (only values the target behaves as), converted (listed
constants, templates), completed with the target's differing defaults, and wrapped
(a fused activation becomes a layer after the call). A template or default may name
another source argument as ``$name`` (string.Template syntax): its value, or its table
``default`` when the call omits it (a value computed from several arguments, as a
scheduler's closed-form ``lr_lambda``). Anything else raises :class:`NotConverted` with
the reason the marker comment gives."""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from polytrain.porting.code.int_values import is_int_valued
from polytrain.porting.code.table import ANY, Arg, Entry, literal

TYPE_INT, TYPE_LIST = "<int>", "<list>"  # target_by keys matching a kind of literal
TYPE_VALUE = "<value>"  # a target_by key matching a value that is not a literal (a name)
STDLIB = ("math", "os", "types")  # modules the table's code may name: imported where it does

NO_SPACE = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)
_EMPTY = cst.Module(body=[])


class NotConverted(Exception):
    """A use the table cannot convert; the message is the reason."""


def code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _value(expr: cst.BaseExpression) -> tuple[bool, Any]:
    """(is a literal, its value)."""
    try:
        return True, ast.literal_eval(code(expr).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _same(a: Any, b: Any) -> bool:
    """Literal equality that keeps ``False`` apart from ``0`` and ``1.0`` from ``True``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b) and (a is None) == (b is None)


def _listing(spec: Arg) -> str:
    values = [v for v in (*spec.drop, *spec.convert, *spec.edits) if v != ANY]
    return ", ".join(values)


def _atom(text: str) -> str:
    """``text`` in parentheses unless it is a name, number, string or call."""
    try:
        node = cst.parse_expression(text)
    except cst.ParserSyntaxError:
        return f"({text})"
    simple = (cst.Name, cst.Integer, cst.Float, cst.SimpleString, cst.Attribute, cst.Call)
    signed = isinstance(node, cst.UnaryOperation) and isinstance(node.expression, simple[1:3])
    return text if isinstance(node, simple) or signed else f"({text})"


@dataclass
class Converted:
    """The target callable's name, its arguments, and the layers that follow it."""

    target: str
    args: list[cst.Arg]
    wraps: list[str] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    moved: dict[str, cst.BaseExpression] = field(default_factory=dict)
    imports: set[str] = field(default_factory=set)  # STDLIB modules the table code names
    inits: list[tuple[str, str]] = field(default_factory=list)  # parameter -> initializer
    arounds: list[tuple[str, str]] = field(default_factory=list)  # helper -> the value


@dataclass
class _Bound:
    spec: Arg
    node: cst.Arg
    position: int | None  # its index among the source's positional arguments


def _spread(spec: Arg, arg: cst.Arg, api: str) -> list[cst.Arg]:
    """A dict display's items as keyword arguments (``{'learning_rate': 0.1}``)."""
    value = arg.value
    if not isinstance(value, cst.Dict):
        raise NotConverted(f"`{spec.name}` is not a dict display: its keys cannot be seen")
    out = []
    for element in value.elements:
        key = element.key if isinstance(element, cst.DictElement) else None
        is_literal, name = _value(key) if key is not None else (False, None)
        if not (is_literal and isinstance(name, str) and name.isidentifier()):
            raise NotConverted(f"`{spec.name}` has a key that is not a string literal")
        out.append(cst.Arg(value=element.value, keyword=cst.Name(name), equal=NO_SPACE))
    return out


def _bind(entry: Entry, args: Sequence[cst.Arg], api: str) -> list[_Bound]:
    bound: list[_Bound] = []
    packed: list[cst.Arg] = []
    pack = next((a for a in entry.args if a.packs), None)
    for i, arg in enumerate(args):
        if arg.star == "*" and pack is not None and i >= entry.args.index(pack):
            packed.append(arg)  # ``*parts`` into the packed list: ``[*parts]``
            continue
        if arg.star and _all_dropped(entry):
            continue  # whatever they hold is dropped (``hybridize(**options)``)
        if arg.star:
            raise NotConverted(f"`{arg.star}` arguments hide their names from the table")
        if arg.keyword is None:
            if pack is not None and i >= entry.args.index(pack):
                packed.append(arg)
                continue
            if i >= len(entry.args):
                raise NotConverted(f"more positional arguments than {api} takes in the table")
            at = entry.args[i]
            if at.spread:
                bound.extend(_keywords(entry, _spread(at, arg, api)))
                continue
            bound.append(_Bound(at, arg, i))
            continue
        spec = entry.arg(arg.keyword.value)
        if spec is None:
            raise NotConverted(f"its argument `{arg.keyword.value}=` is not in the table")
        if spec.spread:
            bound.extend(_keywords(entry, _spread(spec, arg, api)))
            continue
        bound.append(_Bound(spec, arg, None))
    if pack is not None and packed:
        items = [cst.StarredElement(a.value) if a.star else cst.Element(a.value) for a in packed]
        whole = cst.Arg(value=cst.List(items))
        bound.insert(0, _Bound(pack, whole, entry.args.index(pack)))
    return bound


def _all_dropped(entry: Entry) -> bool:
    """A statement that goes whatever its arguments are: ``*args`` / ``**kwargs`` hide
    nothing it needs."""
    return entry.kind == "remove" and all(ANY in a.drop for a in entry.args)


def _keywords(entry: Entry, args: Sequence[cst.Arg]) -> list[_Bound]:
    out = []
    for arg in args:
        assert arg.keyword is not None
        spec = entry.arg(arg.keyword.value)
        if spec is None:
            raise NotConverted(f"its setting `{arg.keyword.value}` is not in the table")
        out.append(_Bound(spec, arg, None))
    return out


def _target(entry: Entry, bound: list[_Bound]) -> tuple[str, str | None]:
    """The target name (``target_by`` picks it by an argument's value) and the parameter
    consumed choosing it."""
    if entry.target_by is None:
        return entry.target, None
    name, choices, keep = entry.target_by
    consumed = None if keep else name
    given = next((b for b in bound if b.spec.name == name), None)
    if given is None:
        return entry.target, consumed
    is_literal, value = _value(given.node.value)
    display = isinstance(given.node.value, cst.List | cst.Tuple)  # ``[a, b]``: a list
    for key, target in choices.items():
        if key not in (ANY, TYPE_VALUE) and is_literal and _matches(value, key):
            return target, consumed
        if key == TYPE_LIST and display:
            return target, consumed
        if key == TYPE_INT and is_int_valued(given.node.value):  # ``x.shape[-1]``
            return target, consumed
    if not is_literal and TYPE_VALUE in choices:
        return choices[TYPE_VALUE], consumed
    if ANY in choices:
        return choices[ANY], consumed
    spec = entry.arg(name)
    why = f" ({spec.why})" if spec is not None and spec.why else ""
    raise NotConverted(
        f"`{name}={code(given.node.value)}`: the table converts only {', '.join(choices)}{why}"
    )


def _matches(value: Any, key: str) -> bool:
    """A literal value against a ``target_by`` key: a literal, or a kind of literal
    (``<int>``: an int, ``<list>``: a list or tuple display, also of names: ``_target``)."""
    if key == TYPE_INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if key == TYPE_LIST:
        return isinstance(value, list | tuple)
    return _same(value, literal(key))


def _edits(bound: list[_Bound], api: str) -> dict[str, str]:
    """Source argument -> the template its value goes into, set by another argument's
    literal value (``transpose_y=True``: ``y`` becomes ``y.mT``)."""
    out: dict[str, str] = {}
    for b in bound:
        if not b.spec.edits:
            continue
        is_literal, value = _value(b.node.value)
        for key, (other, template) in b.spec.edits.items():
            if is_literal and _same(value, literal(key)):
                if not any(o.spec.name == other for o in bound):
                    raise NotConverted(f"`{b.spec.name}={key}` needs `{other}` given")
                out[other] = template
    return out


@dataclass
class _Refs:
    """The source arguments a template or default names as ``$name``: the call's values,
    else their table defaults; the STDLIB modules the filled-in table code names."""

    entry: Entry
    given: Mapping[str, str]
    imports: set[str] = field(default_factory=set)

    def fill_with(self, table_code: str, values: Mapping[str, str], atoms: set[str]) -> str:
        """``table_code`` with ``$name`` from ``values`` (in parentheses where needed, for
        the names in ``atoms``), else as ``fill`` finds them."""
        given, self.given = self.given, {**self.given, **values}
        try:
            template = string.Template(table_code)
            out = {n: (_atom(v) if n in atoms and v else v) for n, v in values.items()}
            for name in template.get_identifiers():
                if name not in out:
                    out[name] = self._value_of(name)
            self.imports.update(m for m in STDLIB if re.search(rf"\b{m}\.", table_code))
            return template.substitute(out)
        finally:
            self.given = given

    def _value_of(self, name: str) -> str:
        spec = self.entry.arg(name)
        found = self.given.get(name, spec.default if spec is not None else None)
        if found is None:
            raise NotConverted(f"`{name}=` is not given: the conversion needs its value")
        return _atom(found)

    def fill(self, table_code: str, value: str = "") -> str:
        template = string.Template(table_code)
        values = {"__value__": value}
        for name in template.get_identifiers():
            if name not in values:
                values[name] = self._value_of(name)
        self.imports.update(m for m in STDLIB if re.search(rf"\b{m}\.", table_code))
        return template.substitute(values)


def _convert_value(spec: Arg, node: cst.Arg, refs: _Refs) -> str | None:
    """The target code of one argument's value, or None when it is dropped."""
    if any(_same(_value(node.value)[1], literal(k)) for k in spec.edits if _value(node.value)[0]):
        return None  # it edits another argument (``_edits``)
    text = code(node.value)
    restricted = bool(spec.drop or spec.convert) or spec.to is None
    if ANY in spec.drop:
        return None
    is_literal, value = _value(node.value)
    if is_literal:
        if any(_same(value, literal(d)) for d in spec.drop):
            return None
        for key, target in spec.convert.items():
            if _same(value, literal(key)):
                return refs.fill(target)
    if spec.others:
        return text
    listed = is_literal and bool(spec.drop or spec.convert)
    if spec.template is not None and not listed:
        return refs.fill(spec.template.format("$__value__"), _atom(text))
    if not restricted:
        return None if spec.to is None else text
    why = spec.why or "PyTorch has no such argument"
    allowed = _listing(spec)
    also = f"; the table takes only {allowed}" if allowed else ""
    return _fail(f"`{spec.name}={text.strip()}`: {why}{also}")


def _fail(reason: str) -> str:
    raise NotConverted(reason)


def _keyword(name: str, value: cst.BaseExpression, original: cst.Arg | None) -> cst.Arg:
    equal = original.equal if original is not None and original.keyword is not None else NO_SPACE
    return cst.Arg(value=value, keyword=cst.Name(name), equal=equal)


def convert_arguments(  # noqa: C901 - one step per rule of a mapping entry, in order
    entry: Entry, args: Sequence[cst.Arg], api: str, receiver: str | None = None
) -> Converted:
    """The converted call's target, arguments and wrapping layers (NotConverted if not).
    An ``expression`` entry's target comes back filled in (``$name``, ``$self``: the
    method's ``receiver``), with no arguments."""
    passed = [a for a in args if a.star == "**"] if entry.passes_kwargs else []
    args = [a for a in args if a not in passed]  # ``**kwargs`` given on as they are
    bound = _bind(entry, args, api)
    target, chooser = _target(entry, bound)
    emitted: list[tuple[str, cst.BaseExpression, _Bound | None]] = []
    wraps: list[str] = []
    before: list[str] = []
    moved: dict[str, cst.BaseExpression] = {}
    inits: list[tuple[str, str]] = []
    arounds: list[tuple[str, str]] = []
    filled: dict[str, str] = {}  # source argument -> its converted code ("" dropped)
    edits = _edits(bound, api)
    values = {b.spec.name: code(b.node.value).strip() for b in bound}
    refs = _Refs(entry, {**values, **({"self": receiver} if receiver is not None else {})})
    for b in bound:
        if b.spec.name == chooser:
            continue
        if b.spec.moves:
            moved[b.spec.name] = b.node.value
            continue
        if _around(b.spec, b.node):
            arounds.append((b.spec.around, code(b.node.value).strip()))
            if b.spec.to is None:
                continue
        new = _convert_value(b.spec, b.node, refs)
        if new is not None and b.spec.init and not (b.spec.to and _listed(b.spec, b.node)):
            inits.append((b.spec.init, _initializer(b.spec, b.node, new)))
            continue
        filled[b.spec.name] = "" if new is None else new
        if new is None or entry.kind == "expression":
            continue
        if b.spec.name in edits:
            new = edits[b.spec.name].format(_atom(new))
        if b.spec.wrap or b.spec.before:
            (wraps if b.spec.wrap else before).append(new)
            continue
        if new.startswith("*"):
            star_value = cst.parse_expression(new[1:])
            emitted.append((f"*{b.spec.name}", star_value, b))
            continue
        value = b.node.value if new == code(b.node.value) else cst.parse_expression(new)
        name = b.spec.target_name
        assert name is not None
        emitted.append((name.lstrip("*"), value, b))
    given = {b.spec.name for b in bound}
    if entry.kind == "expression":
        code_ = _expression(entry, target, refs, filled, given)
        return Converted(code_, [], imports=refs.imports, inits=inits, arounds=arounds)
    for spec in entry.args:
        if spec.name in given:
            continue
        if spec.need:
            raise NotConverted(f"`{spec.name}=` is not given: {spec.need}")
        default = spec.default_for.get(target, spec.default)
        if default is not None and spec.before:
            before.append(default)
        elif default is not None and spec.target_name:
            emitted.append((spec.target_name, cst.parse_expression(refs.fill(default)), None))
    emitted = _tuples(entry, emitted)
    laid = _layout(entry, emitted, args) + passed
    return Converted(target, laid, wraps, before, moved, refs.imports, inits, arounds)


def _around(spec: Arg, node: cst.Arg) -> bool:
    """The value goes to the argument's ``around`` helper: given, not dropped, and not a
    literal where the argument is also passed on or says ``why`` other literals cannot be
    converted (those are marked: Paddle's ``data_format='NHWC'``)."""
    if not spec.around:
        return False
    is_literal, value = _value(node.value)
    dropped = any(_same(value, literal(d)) for d in spec.drop)
    if is_literal and (spec.to is not None or dropped or spec.why):
        return False
    return ANY not in spec.drop


def _initializer(spec: Arg, node: cst.Arg, new: str) -> str:
    """An ``init`` argument's converted value: a literal the table does not convert is no
    initializer (``weight_attr=False``: no affine, not converted)."""
    if _value(node.value)[0] and not _listed(spec, node):
        why = spec.why or "not an initializer the table converts"
        raise NotConverted(f"`{spec.name}={code(node.value).strip()}`: {why}")
    return new


def _listed(spec: Arg, node: cst.Arg) -> bool:
    """The value is a literal the entry's ``convert`` lists (``bias_attr=False``)."""
    is_literal, value = _value(node.value)
    return is_literal and any(_same(value, literal(k)) for k in spec.convert)


def _expression(
    entry: Entry, target: str, refs: _Refs, filled: dict[str, str], given: set[str]
) -> str:
    """An expression entry's code: each ``$name`` the argument's converted value (its
    template applied: ``, init={}``), its table default when absent, "" when dropped."""
    values = {name.lstrip("*"): value for name, value in filled.items()}  # ``*arrays``: a list
    for spec in entry.args:
        if spec.name in given:
            continue
        if spec.need:
            raise NotConverted(f"`{spec.name}=` is not given: {spec.need}")
        if spec.default is not None:
            values[spec.name.lstrip("*")] = spec.default
    templated = {a.name for a in entry.args if a.template}
    return refs.fill_with(target, values, set(values) - templated)


def _tuples(
    entry: Entry, emitted: list[tuple[str, cst.BaseExpression, _Bound | None]]
) -> list[tuple[str, cst.BaseExpression, _Bound | None]]:
    """``betas.0`` and ``betas.1`` merged into ``betas=(b1, b2)`` where either was given."""
    parts: dict[str, dict[int, cst.BaseExpression]] = {}
    out: list[tuple[str, cst.BaseExpression, _Bound | None]] = []
    given: set[str] = set()
    for name, value, b in emitted:
        base, dot, index = name.partition(".")
        if not dot:
            out.append((name, value, b))
            continue
        parts.setdefault(base, {})[int(index)] = value
        if b is not None:
            given.add(base)
    for base, values in parts.items():
        if base not in given:
            continue  # only defaults: the target's own defaults are the same
        for spec in entry.args:
            head, dot, index = (spec.target_name or "").partition(".")
            if dot and head == base and int(index) not in values:
                assert spec.default is not None, f"{entry.source}: {spec.name} needs a default"
                values[int(index)] = cst.parse_expression(spec.default)
        items = [cst.Element(values[i]) for i in sorted(values)]
        out.append((base, cst.Tuple(items), None))
    return out


def _layout(
    entry: Entry,
    emitted: list[tuple[str, cst.BaseExpression, _Bound | None]],
    original: Sequence[cst.Arg],
) -> list[cst.Arg]:
    """Positional where the target takes the argument at the same place the source had it
    (or always, for names the table marks ``!``), keywords after, in the source's order;
    the original separators (and the comments in them) kept by position."""
    by_name = {name: (value, b) for name, value, b in emitted}
    out: list[cst.Arg] = []
    used: set[str] = set()
    for i, wanted in enumerate(entry.positional):
        always = wanted.startswith("!")
        name = wanted.lstrip("!")
        if name not in by_name:
            break
        value, b = by_name[name]
        if not always and (b is None or b.position != i):
            break
        out.append(cst.Arg(value=value))
        used.add(name)
    for name, value, _b in emitted:
        if name.startswith("*") and name not in used:
            out.append(cst.Arg(value=value, star="*"))
            used.add(name)
    for name, value, b in emitted:
        if name not in used:
            out.append(_keyword(name, value, b.node if b else None))
    commas = [a.comma for a in original]
    fixed = []
    for i, arg in enumerate(out):
        if i == len(out) - 1:
            comma = commas[-1] if commas else _DEFAULT  # a trailing comma stays
        else:
            comma = commas[i] if i < len(commas) - 1 else _DEFAULT
        fixed.append(arg.with_changes(comma=comma))
    return fixed


_DEFAULT: Any = cst.MaybeSentinel.DEFAULT
