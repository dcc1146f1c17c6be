"""Convert weights between the registered native formats (PyTorch .pt, Paddle .pdparams,
MXNet .params, ...) and neutral checkpoints, without the frameworks (a format whose
writing needs its framework, like .pt, says so). ``polytrain convert IN OUT --to FORMAT``.

Canonical names and layout are PyTorch's. A :class:`NameMap` says, for one format, which
native tensor holds each canonical one and whether it is stored transposed. The maps of
the built-in models follow from the spec and the format's
:class:`~polytrain.backend.native_format.LayoutRules`, declared by its plugin (see each
backend's ``_format.py``); they agree with what each backend's ``save_native`` writes
and ``load_native`` reads: PyTorch identical (plus ``num_batches_tracked``, and without
DDP's ``module.``), Paddle with Linear weights [in, out] and BatchNorm ``_mean`` /
``_variance``, MXNet with BatchNorm ``gamma`` / ``beta``.

For your own model, give a JSON map (``--map FILE``, or :func:`load_map` in Python; the
syntax is in :mod:`polytrain.io.name_map`): keys are canonical names (your PyTorch model's
state-dict names), entries exact, prefix or regex, each giving the native name and/or
the layout. A map may be partial: its entries are merged over the built-in map (with
``--model``) or the generic rules. It describes the non-canonical side of a conversion;
to convert between two non-canonical formats give one per format (``{"paddle": {...},
"mxnet": {...}}``). :func:`plan_map` (``--print-map``) gives the map the tool would use.

The generic rules, for a model that is none of the built-in ones: canonical formats and
neutral as they are; the others with their leaf renames undone. Where a format stores
some layer kind's weights transposed, a 2-D tensor's layout is decided by what its layer
is, from the map or from what the file itself records (the plugin's
:meth:`~polytrain.backend.native_format.NativeFormat.layer_kinds`), never from a name or
a shape; without that evidence the conversion stops with one message naming the tensors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_shapes, name_list
from polytrain.backend.native_format import (
    CompanionRoles,
    LayoutRules,
    NativeFormat,
    TensorRole,
)
from polytrain.errors import CheckpointError, ConfigError, PolytrainError
from polytrain.io import native as native_io
from polytrain.io.attention import pack_read, unpack_write
from polytrain.io.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from polytrain.io.name_map import (
    MapEntry,
    NameMap,
    UserEntry,
    UserMap,
    load_map,
    undecided_message,
)
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import (
    MODELS,
    BatchNorm2d,
    ModelSpec,
    get_model_spec,
    layer_parameters,
)
from polytrain.neutral.spec_file import resolve_model_spec
from polytrain.utils.output_paths import folder_inputs, refuse_overwriting_inputs

PathLike = str | os.PathLike[str]
DTYPES = ("float32", "float64")  # of the float tensors a conversion writes
_LIST_MAX = 6
_NORM = BatchNorm2d.__name__  # the layer kind the generic rules recognise (running stats)
__all__ = [
    "ConvertReport",
    "MapEntry",
    "NameMap",
    "Weights",
    "builtin_map",
    "convert",
    "load_map",
    "plan_map",
    "read_weights",
    "targets",
    "write_weights",
]  # fmt: skip


# -- maps -----------------------------------------------------------------------------------------


def builtin_map(spec: ModelSpec, framework: str) -> NameMap:
    """The map of a neutral spec for the format ``framework``, as its plugin's
    :class:`~polytrain.backend.native_format.LayoutRules` name and lay out the tensors."""
    layout = native_io.get_format(framework).layout
    entries: dict[str, MapEntry] = {}
    constants: dict[str, np.ndarray] = {}
    for path, layer in spec.layers():
        kind = type(layer).__name__
        for leaf, shape in layer_parameters(layer).items():
            native = f"{path}.{layout.native_leaf(kind, leaf)}"
            transposed = layout.is_transposed(kind, leaf)
            entries[f"{path}.{leaf}"] = MapEntry(native, transposed, shape, kind)
        for leaf, value in layout.constants.get(kind, {}).items():
            constants[f"{path}.{leaf}"] = value
    ignore = layout.ignored_suffixes
    return NameMap(framework, entries, constants, ignore, source=f"model {spec.name!r}")


# -- reading --------------------------------------------------------------------------------------


@dataclass
class Weights:
    """Canonical weights read from any format, with what is known about them."""

    params: dict[str, np.ndarray]
    spec: ModelSpec | None
    format: str  # a registered format's name, or neutral
    path: Path
    notes: list[str] = field(default_factory=list)
    checkpoint: Any = None  # the Checkpoint, when read from a neutral one
    kinds: dict[str, str] = field(default_factory=dict)  # canonical name -> layer kind, if known


def read_weights(
    path: PathLike,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    other: str = NEUTRAL,
) -> Weights:
    """Canonical weights from a native file of a registered format (.pt, .pdparams,
    .params, ...) or a neutral checkpoint (format detected by content). ``model`` (a
    built-in name or spec) and ``name_map`` say how names map (see the module docstring);
    ``other`` is the format on the other side of a conversion, which decides what a map
    without format keys describes."""
    return _read(path, _spec(model), name_map, other)[0]


def read_weights_with_map(
    path: PathLike,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    other: str = NEUTRAL,
) -> tuple[Weights, NameMap | None]:
    """:func:`read_weights` and the map that read them (None for a neutral checkpoint)."""
    return _read(path, _spec(model), name_map, other)


def _read(path: PathLike, spec: ModelSpec | None, name_map: PathLike | Mapping[str, Any] | None,
          other: str, *, decided: bool = True) -> tuple[Weights, NameMap | None]:  # fmt: skip
    """The weights and the map that read them (None for a neutral checkpoint); with
    ``decided`` False, tensors of unknown layout are read as they are."""
    fmt = native_io.detect_format(path)
    user = load_map(name_map) if name_map is not None else None
    if fmt == NEUTRAL:
        return _read_neutral(path, spec), None
    declared = native_io.get_format(fmt)
    tensors = declared.read(path)
    for prefix in declared.layout.strip_prefixes:
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    what = f"{path} ({declared.label})"
    notes: list[str] = []
    if spec is None and user is None:
        spec = _detect_model(fmt, tensors, notes)
    side = _user_side(fmt, user, other)
    if spec is not None:
        nmap = _merge_spec(builtin_map(spec, fmt), side, spec)
    else:
        nmap = _generic_read_map(fmt, tensors, path, side, notes)
    if decided:
        shapes = {n: _shape_of(tensors, e.native) for n, e in nmap.entries.items()}
        _check_decided(nmap, what, declared.layer_evidence, shapes)
    try:
        params = nmap.to_canonical(tensors, what)
    except CheckpointError as exc:
        found = _matching_models(fmt, tensors) if user is None else []
        if not found:
            raise
        raise CheckpointError(
            f"{exc} It holds model {found[0]!r}: pass --model {found[0]}."
        ) from None
    kinds = {name: e.kind for name, e in nmap.entries.items() if e.kind is not None}
    floats = _float_dtype(params)  # a float64 file stays float64 until the writer decides
    weights = Weights(_as_floats(params, floats), spec, fmt, Path(path), notes, kinds=kinds)
    return weights, nmap


def _read_neutral(path: PathLike, spec: ModelSpec | None) -> Weights:
    ck = load_checkpoint(find_checkpoint(path))
    model = ck.manifest["model"]
    saved = None
    if model.get("spec"):
        saved = ModelSpec.from_dict(model["spec"])
    elif model.get("name") in MODELS:
        saved = get_model_spec(model["name"])
    if spec is not None:
        shapes = {n: tuple(a.shape) for n, a in ck.params.items()}
        if (saved is not None and saved.name != spec.name) or shapes != spec.parameter_shapes():
            found = f"model {saved.name!r}" if saved is not None else "a model without a spec"
            why = (
                compare_shapes(spec.parameter_shapes(), shapes).describe(_LIST_MAX)
                or "the same tensors, another name"
            )
            raise CheckpointError(
                f"Checkpoint {ck.path} holds {found}, not model {spec.name!r}: {why}."
            )
    return Weights(ck.params, spec or saved, "neutral", ck.path, [], ck)


def _detect_model(
    fmt: str, tensors: Mapping[str, np.ndarray], notes: list[str]
) -> ModelSpec | None:
    found = _matching_models(fmt, tensors)
    if not found:
        return None
    if len(found) > 1:
        notes.append(
            f"model {found[0]} detected (same tensors as {', '.join(found[1:])}; "
            "pass --model to choose)"
        )
    else:
        notes.append(f"model {found[0]} detected")
    return get_model_spec(found[0])


def _matching_models(fmt: str, tensors: Mapping[str, np.ndarray]) -> list[str]:
    """Built-in models whose native file for ``fmt`` has exactly these names and shapes."""
    ignored = native_io.get_format(fmt).layout.ignored_suffixes
    have = {k: tuple(np.shape(v)) for k, v in tensors.items() if not k.endswith(ignored)}
    out = []
    for name in MODELS:
        nmap = builtin_map(get_model_spec(name), fmt)
        want = {e.native: e.native_shape(e.shape or ()) for e in nmap.entries.values()}
        if want == have:
            out.append(name)
    return out


def _generic_read_map(fmt: str, tensors: Mapping[str, np.ndarray], path: PathLike,
                      user: UserMap | None, notes: list[str]) -> NameMap:  # fmt: skip
    """A map for a model that is none of the built-in ones: the user's entries first, then
    the generic rules (the format's leaf renames undone); where the format stores some
    layer kinds transposed, a 2-D tensor's layout comes from the map or from what the file
    itself records about its layer, else it stays undecided."""
    declared = native_io.get_format(fmt)
    layout = declared.layout
    renames = layout.canonical_leaves()
    transposing = bool(_kinds(declared))
    companion = declared.companion_roles(path)
    roles = companion.roles if companion is not None else {}
    evidence = (declared.layer_kinds(path) or {}) if transposing and companion is None else {}
    user = user or UserMap({})
    by_native = {_exact_native(n, e, layout): n for n, e in user.exact.items() if not e.parts}
    packed = {part: name for name, e in user.exact.items() for part in e.parts}
    entries: dict[str, MapEntry] = {}
    matched: set[str] = set()
    for native, value in tensors.items():
        if native.endswith(layout.ignored_suffixes):
            continue
        if native in packed:  # a part of a packed tensor the map lists
            name = packed[native]
            entries.setdefault(name, _exact_entry(name, user.exact[name], layout))
            continue
        if native in by_native:
            canonical = by_native[native]
            given = user.exact[canonical]
        else:
            name, given = native, UserEntry()
            found = user.rule_for_native(native)
            if found is not None:
                (rule, name), given = found, UserEntry(kind=found[0].kind)
                matched.add(rule.key)
            canonical = _role_name(name, roles.get(native), renames)
        if canonical in entries:
            raise ConfigError(
                f"{path}: {entries[canonical].native!r} and {native!r} would both be "
                f"{canonical!r}; give one of them another name in the map."
            )
        role = roles.get(native)
        kind = given.kind or (role.kind if role is not None else evidence.get(native))
        transpose = given.transpose
        if transpose is None:
            transpose = _layout(layout, kind, canonical, np.ndim(value), transposing)
        entries[canonical] = MapEntry(native, transpose, given.shape, kind)
    if layout.attention:  # q/k/v Linears kept apart: packed as PyTorch packs them
        entries = pack_read(entries, tensors, layout.attention, user, notes)
    for name, given in user.exact.items():  # named by the map, not in the file: missing
        entries.setdefault(name, _exact_entry(name, given, layout))
    if companion is not None:
        notes.extend(_companion_notes(companion, entries))
    _generic_notes(fmt, declared, entries, user, matched, notes)
    return NameMap(fmt, entries, ignore=layout.ignored_suffixes, source=f"the generic {fmt} rules")


def _role_name(name: str, role: TensorRole | None, renames: Mapping[str, str]) -> str:
    """The canonical name of a native tensor named ``name`` (as the map rules left it):
    its leaf from its role where a companion file gives one (``linear_0.w_0`` fed to a
    matmul -> ``linear_0.weight``), else the format's leaf renames undone."""
    native_leaf = role.native_leaf if role is not None else None
    if role is not None and native_leaf is not None:
        for sep in (".", "_"):
            if name.endswith(sep + native_leaf):
                return f"{name[: -len(native_leaf) - 1]}.{role.leaf}"
    head, _, leaf = name.rpartition(".")
    return f"{head}.{renames.get(leaf, leaf)}" if head else renames.get(leaf, leaf)


def _companion_notes(companion: CompanionRoles, entries: Mapping[str, MapEntry]) -> list[str]:
    """What the file beside the weights established: the kinds found, the tensors named
    by their role, those it says nothing about."""
    notes = list(companion.notes)
    roles = companion.roles
    if not roles:
        return notes
    kinds: dict[str, int] = {}
    for role in roles.values():
        if role.kind is not None:
            kinds[role.kind] = kinds.get(role.kind, 0) + 1
    found = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"
    notes.append(
        f"layer kinds from {companion.source} (the op each tensor feeds), in tensors: {found}"
    )
    renamed = [
        f"{e.native} -> {name}" for name, e in entries.items()
        if e.native in roles and name.rpartition(".")[2] != e.native.rpartition(".")[2]
    ]  # fmt: skip
    if renamed:
        notes.append(f"named by their role in {companion.source}: {_names(renamed)}")
    unknown = [e.native for e in entries.values() if e.native not in roles]
    if unknown:
        notes.append(f"no op of {companion.source} establishes: {_names(unknown)}")
    return notes


def _generic_notes(fmt: str, declared: NativeFormat, entries: Mapping[str, MapEntry],
                   user: UserMap, matched: set[str], notes: list[str]) -> None:  # fmt: skip
    renames = declared.layout.canonical_leaves()
    rule = "as it is"
    if renames:  # say what was done, not what could have been
        renamed = [
            e.native for name, e in entries.items()
            if e.native != name and e.native.rpartition(".")[2] in renames
        ]  # fmt: skip
        rule = f"{'/'.join(renames)} -> {'/'.join(renames.values())}: " + (
            f"{len(renamed)} tensor(s) renamed"
            if renamed
            else f"none renamed, no name ends in {' or '.join('.' + r for r in renames)}"
        )
    notes.append(f"not a built-in model: generic {fmt} rules ({rule})")
    transposed = [n for e in entries.values() if e.transpose for n in e.natives]
    if transposed:  # the kinds these tensors are, else every kind the format transposes
        kinds = "/".join(sorted({e.kind for e in entries.values() if e.transpose and e.kind}))
        notes.append(f"transposed as {kinds or _kinds(declared)} weights: {_names(transposed)}")
    unused = [r.key for r in user.rules if r.key not in matched]
    if unused:
        notes.append(f"map entries that matched no tensor: {_names(unused)}")


def _layout(layout: LayoutRules, kind: str | None, name: str, ndim: int,
            transposing: bool) -> bool | None:  # fmt: skip
    """Whether a tensor is stored transposed: by its layer kind where known; a 2-D tensor
    of unknown kind is undecided (None) in a format that transposes some kind."""
    if kind is not None:
        return layout.is_transposed(kind, name.rpartition(".")[2])
    return None if transposing and ndim == 2 else False


def _exact_entry(name: str, given: UserEntry, layout: LayoutRules) -> MapEntry:
    """The entry of an exact map entry read as it is (a packed one: its layout from
    ``transpose``, or from ``kind`` for its parts' leaf)."""
    if not given.parts:
        return MapEntry(_exact_native(name, given, layout), False, given.shape)
    transpose = given.transpose
    if transpose is None and given.kind is not None:
        transpose = layout.is_transposed(given.kind, given.parts[0].rpartition(".")[2])
    return MapEntry(given.parts[0], transpose, given.shape, given.kind, given.parts)


def _exact_native(name: str, given: UserEntry, layout: LayoutRules) -> str:
    """The native name of an exact map entry: as given, else the canonical one with the
    format's leaf name for the entry's kind."""
    if given.native is not None:
        return given.native
    if given.kind is None:
        return name
    head, _, leaf = name.rpartition(".")
    native_leaf = layout.native_leaf(given.kind, leaf)
    return f"{head}.{native_leaf}" if head else native_leaf


def _check_decided(nmap: NameMap, what: str, evidence: str,
                   shapes: Mapping[str, tuple[int, ...]]) -> None:  # fmt: skip
    if not nmap.undecided():
        return
    declared = native_io.get_format(nmap.framework)
    stores = (
        f"{declared.label} stores {_kinds(declared)} weights transposed "
        f"({declared.layout.note}) and other 2-D tensors as they are"
    )
    raise CheckpointError(undecided_message(what, nmap, shapes, evidence, stores))


# -- writing --------------------------------------------------------------------------------------


def write_weights(
    path: PathLike,
    weights: Weights | Mapping[str, np.ndarray],
    to: str,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    other: str = NEUTRAL,
    dtype: str | None = None,
) -> Path:
    """Write canonical weights as ``to`` (a registered format or neutral), atomically;
    for neutral ``path`` is a checkpoint directory. Nothing is written on any error.
    ``dtype`` (float32 or float64) is that of the float tensors written; by default
    float32 for the native formats (what ordinary framework code loads: Paddle refuses a
    float64 tensor for a float32 parameter) and the weights' own for a neutral checkpoint
    (float64 after a ``--precision fp64`` run)."""
    _check_target(to)
    if dtype not in (None, *DTYPES):
        raise ConfigError(f"Unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    if isinstance(weights, Weights):
        params, spec, ck = weights.params, _spec(model) or weights.spec, weights.checkpoint
        own = _float_dtype(params)
    else:  # plain arrays are canonical float32 unless ``dtype`` says otherwise
        params, spec, ck, own = dict(weights), _spec(model), None, "float32"
    target = dtype or (own if to == NEUTRAL else "float32")
    if target != own and dtype is None and isinstance(weights, Weights):
        weights.notes.append(
            f"{own} weights (a --precision fp64 run) written as {target}, "
            "what native code expects; pass --dtype float64 to keep them"
        )
    params = _as_floats(params, target)
    if spec is not None:
        shapes = {n: np.shape(a) for n, a in params.items()}
        problems = compare_shapes(spec.parameter_shapes(), shapes).describe(_LIST_MAX)
        if problems:
            raise CheckpointError(f"The weights are not model {spec.name!r}: {problems}.")
    user = load_map(name_map) if name_map is not None else None
    if to == NEUTRAL:
        return _write_neutral(path, params, spec, ck, weights, target)
    kinds = weights.kinds if isinstance(weights, Weights) else {}
    nmap = _write_map(to, params, spec, user, other, kinds)
    if isinstance(weights, Weights):
        weights.notes.extend(nmap.notes)
    shapes = {n: _shape_of(params, n) for n in nmap.entries}
    _check_decided(nmap, f"writing {path}", "the weights (a state dict records no layer kinds)",
                   shapes)  # fmt: skip
    native_io.write_native(path, to, nmap.to_native(params))
    return Path(path)


def _write_map(to: str, params: Mapping[str, np.ndarray], spec: ModelSpec | None,
               user: dict[str | None, UserMap] | None, other: str,
               kinds: Mapping[str, str]) -> NameMap:  # fmt: skip
    """The map that writes ``params`` as ``to``: the built-in one (with the user's entries
    over it) for a model spec, else the user's entries over the generic rules."""
    side = _user_side(to, user, other)
    if spec is not None:
        return _merge_spec(builtin_map(spec, to), side, spec)
    return _generic_write_map(to, params, side, kinds)


def _write_neutral(path: PathLike, params: dict[str, np.ndarray], spec: ModelSpec | None,
                   ck: Any, weights: Any, dtype: str) -> Path:  # fmt: skip
    source = (
        {"format": weights.format, "path": str(weights.path)}
        if isinstance(weights, Weights)
        else {}
    )
    if ck is not None:  # neutral -> neutral keeps the whole training state
        return save_checkpoint(
            path, params=params, optimizer_state=ck.optimizer_state, spec=spec,
            model_name=ck.manifest["model"].get("name"), position=ck.position,
            seed=ck.manifest.get("seed"), recipe=ck.recipe, scaler=ck.scaler,
            history=ck.history, extra=ck.manifest.get("extra") or {},
            backend=ck.manifest["backend"].get("name"),
            framework_version=ck.manifest["backend"].get("framework_version"),
            param_dtype=dtype,
        )  # fmt: skip
    return save_checkpoint(
        path, params=params, spec=spec, extra={"converted_from": source}, param_dtype=dtype
    )


def _generic_write_map(to: str, params: Mapping[str, np.ndarray], user: UserMap | None,
                       kinds: Mapping[str, str]) -> NameMap:  # fmt: skip
    """Names as they are (a normalisation layer's leaves renamed as the format names them);
    where the format stores some layer kinds transposed, a 2-D tensor's layout comes from
    the map or the layer kinds read with the weights, else it stays undecided."""
    declared = native_io.get_format(to)
    layout = declared.layout
    transposing = bool(_kinds(declared))
    user = user or UserMap({})
    unknown = [n for n in user.exact if n not in params]
    if unknown:
        raise ConfigError(f"The map names {_names(unknown)}, which the weights lack.")
    split, split_kinds, split_notes = (
        unpack_write(params, layout.attention, user) if layout.attention else ({}, {}, [])
    )
    entries = {}
    for name, value in params.items():
        if name in split:  # an attention tensor, as the format's Linears store it
            entries[name] = _split_entry(split[name], split_kinds[name], layout, user)
            continue
        given = user.exact.get(name, UserEntry())
        if given.parts:
            entries[name] = _exact_entry(name, given, layout)
            continue
        kind = given.kind
        native = given.native
        if native is None:
            head, _, leaf = name.rpartition(".")
            if kind is None and _looks_like_norm(name, params):
                leaf = layout.native_leaf(_NORM, leaf)
            elif kind is not None:
                leaf = layout.native_leaf(kind, leaf)
            native = f"{head}.{leaf}" if head else leaf
            found = user.rule_for_canonical(native) if name not in user.exact else None
            if found is not None:
                native, kind = found[1], kind or found[0].kind
        kind = kind or kinds.get(name)  # what the source file said, for the layout
        transpose = given.transpose
        if transpose is None:
            transpose = _layout(layout, kind, name, np.ndim(value), transposing)
        entries[name] = MapEntry(native, transpose, given.shape, kind)
    natives = [n for e in entries.values() for n in e.natives]
    dupes = sorted({n for n in natives if natives.count(n) > 1})
    if dupes:
        raise ConfigError(f"Several tensors would be written as {_names(dupes)}: fix the map.")
    constants = {  # what the format adds to each normalisation layer (torch's counter)
        f"{entry.native.rpartition('.')[0]}.{leaf}": value
        for name, entry in entries.items()
        if name.endswith(".running_mean")
        for leaf, value in layout.constants.get(_NORM, {}).items()
    }
    return NameMap(to, entries, constants, source=f"the generic {to} rules", notes=split_notes)


def _split_entry(parts: tuple[str, ...], kind: str, layout: LayoutRules,
                 user: UserMap) -> MapEntry:  # fmt: skip
    """The entry writing one attention tensor as the parts ``parts`` (Linear weights or
    biases), each renamed by the user's prefix or re: entries."""
    renamed = []
    for part in parts:
        found = user.rule_for_canonical(part)
        renamed.append(found[1] if found is not None else part)
    transpose = layout.is_transposed(kind, parts[0].rpartition(".")[2])
    return MapEntry(renamed[0], transpose, None, kind, tuple(renamed) if len(parts) > 1 else ())


def _looks_like_norm(name: str, params: Mapping[str, np.ndarray]) -> bool:
    """weight/bias of a normalisation layer (it has running statistics beside them)."""
    head = name.rpartition(".")[0]
    return f"{head}.running_mean" in params


# -- converting -----------------------------------------------------------------------------------


@dataclass
class ConvertReport:
    """What :func:`convert` did (its ``format()`` is the CLI's output)."""

    source: Path
    source_format: str
    target: Path
    target_format: str
    model: str | None
    tensors: int
    values: int
    notes: list[str]

    def format(self) -> str:
        model = f"model {self.model}" if self.model else "a model without a built-in spec"
        line = (
            f"converted {self.source} ({self.source_format}) -> {self.target} "
            f"({self.target_format}): {model}, {self.tensors} tensors, {self.values:,} values"
        )
        return "\n".join([line, *(f"  note: {n}" for n in self.notes)])


def convert(
    source: PathLike,
    target: PathLike,
    to: str,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    dtype: str | None = None,
) -> ConvertReport:
    """Read ``source`` (any format), write it as ``to`` at ``target`` (float tensors in
    ``dtype``, see :func:`write_weights`). Errors are one-line
    :class:`~polytrain.errors.PolytrainError`; ``target`` is then untouched, and it is
    never one of the inputs (see :func:`conversion_inputs`)."""
    _check_target(to)
    refuse_overwriting_inputs({"the output": target}, conversion_inputs(source, name_map))
    try:
        weights = read_weights(source, model=model, name_map=name_map, other=to)
        written = write_weights(
            target, weights, to, name_map=name_map, other=weights.format, dtype=dtype
        )
    except PolytrainError as exc:  # the CLI prints one line
        raise type(exc)(" ".join(str(exc).split())) from exc
    except OSError as exc:  # the target's directory is read-only, the disk is full, ...
        raise CheckpointError(f"Cannot write {target}: {exc.strerror or exc}.") from exc
    return ConvertReport(
        source=Path(source),
        source_format=weights.format,
        target=written,
        target_format=to,
        model=weights.spec.name if weights.spec else None,
        tensors=len(weights.params),
        values=sum(int(np.size(a)) for a in weights.params.values()),
        notes=weights.notes,
    )


def conversion_inputs(
    source: PathLike, name_map: PathLike | Mapping[str, Any] | None = None
) -> dict[str, PathLike | None]:
    """The files a conversion reads, by option, for
    :func:`~polytrain.utils.output_paths.refuse_overwriting_inputs`: a run folder as the
    checkpoint folder it names (an output beside that checkpoint is fine, one inside it
    is not)."""
    given_map = name_map if isinstance(name_map, str | os.PathLike) else None
    if not os.path.isdir(source):
        return {"INPUT": source, "--map": given_map}
    where: PathLike = source
    with contextlib.suppress(PolytrainError, OSError):
        where = find_checkpoint(source)
    return {**folder_inputs("INPUT", where), "--map": given_map}


def plan_map(
    source: PathLike,
    to: str,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The map :func:`convert` would use for ``source`` and ``to``, in the JSON form of
    ``--map`` (for the side a map describes; per format when both need one), and notes.
    Writes nothing. A tensor whose layout is not known has ``"transpose": null``."""
    _check_target(to)
    try:
        weights, read_map = _read(source, _spec(model), name_map, to, decided=False)
        user = load_map(name_map) if name_map is not None else None
        write_map = None
        if to != NEUTRAL:
            spec = _spec(model) or weights.spec
            write_map = _write_map(to, weights.params, spec, user, weights.format, weights.kinds)
    except PolytrainError as exc:
        raise type(exc)(" ".join(str(exc).split())) from exc
    sides: dict[str, NameMap] = {}
    if read_map is not None:
        sides[weights.format] = read_map
    if write_map is not None and to not in sides:
        sides[to] = write_map
    shapes = {n: tuple(np.shape(a)) for n, a in weights.params.items()}
    maps = {fw: _with_shapes(m, shapes) for fw, m in sides.items()}
    notes = [*weights.notes, *(write_map.notes if write_map is not None else [])]
    undecided = sorted({n for m in sides.values() for n in m.undecided()})
    if undecided:
        notes.append(
            f'{len(undecided)} tensor(s) need a decision: set "transpose" where it is null '
            f"(true for a weight stored transposed, false for any other): {_names(undecided)}"
        )
    others = {weights.format: to, to: weights.format}
    flat = [fw for fw in maps if _flat_map_side(fw, others[fw])]
    if len(maps) == 1 or flat:
        return maps[flat[0] if flat else next(iter(maps))], notes
    return maps, notes


def _with_shapes(nmap: NameMap, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """``nmap.to_dict()`` with the canonical shape of every decided entry."""
    out = nmap.to_dict()
    for name, entry in out.items():
        if entry["transpose"] is not None and name in shapes and "shape" not in entry:
            entry["shape"] = list(shapes[name])
    return out


# -- helpers --------------------------------------------------------------------------------------


def _user_side(fw: str, user: dict[str | None, UserMap] | None, other: str) -> UserMap | None:
    """The user's entries for the ``fw`` side of a conversion whose other side is ``other``."""
    if user is None:
        return None
    if fw in user:
        return user[fw]
    if None in user and _flat_map_side(fw, other):
        return user[None]
    if None in user and not _canonical(fw):
        raise ConfigError(
            f"The map names no framework, and both sides ({fw} and {other}) need one: "
            f'write it as {{"{fw}": {{...}}, "{other}": {{...}}}}.'
        )
    return None


def _merge_spec(base: NameMap, user: UserMap | None, spec: ModelSpec) -> NameMap:
    """The built-in map of ``spec`` with the user's entries over it."""
    if user is None:
        return base
    unknown = [n for n in user.exact if n not in base.entries]
    if unknown:
        raise ConfigError(f"The map names {_names(unknown)}, which model {spec.name!r} lacks.")
    layout = native_io.get_format(base.framework).layout
    merged = {}
    for name, entry in base.entries.items():
        given = user.exact.get(name)
        if given is None:
            found = user.rule_for_canonical(entry.native)
            if found is None:
                merged[name] = entry
                continue
            given = UserEntry(found[1], None, found[0].kind)
        kind = given.kind or entry.kind
        transpose = given.transpose
        if transpose is None:
            transpose = (
                _layout(layout, given.kind, name, 0, False) if given.kind else entry.transpose
            )
        parts = given.parts or entry.parts
        merged[name] = MapEntry(given.native or entry.native, transpose, entry.shape, kind, parts)
    source = f"model {spec.name!r} with the map"
    return NameMap(base.framework, merged, base.constants, base.ignore, source=source)


def _canonical(fw: str) -> bool:
    """Neutral, or a format whose names and layout are the canonical ones."""
    return fw == NEUTRAL or native_io.get_format(fw).layout.canonical


def _flat_map_side(fw: str, other: str) -> bool:
    """A map without format keys describes the non-canonical side (Paddle, MXNet);
    between canonical ones (PyTorch, neutral), the side that is a native file."""
    if not _canonical(fw):
        return _canonical(other) or other == fw
    return fw != NEUTRAL and _canonical(other)


def _spec(model: str | ModelSpec | None) -> ModelSpec | None:
    if model is None or isinstance(model, ModelSpec):
        return model
    return resolve_model_spec(model)  # a built-in, pkg.module:factory or a spec file


def targets() -> tuple[str, ...]:
    """What ``--to`` takes: the registered formats' names, then neutral."""
    return (*native_io.formats(), NEUTRAL)


def _check_target(to: str) -> None:
    if to not in targets():
        raise ConfigError(f"Unknown target {to!r}; use one of {', '.join(targets())}.")


def _kinds(fmt: NativeFormat) -> str:
    """The layer kinds whose weights ``fmt`` stores transposed, for messages."""
    return "/".join(kind for kind, leaves in fmt.layout.transposed.items() if leaves)


def _float_dtype(params: Mapping[str, Any]) -> str:
    """float64 if any float tensor is float64 (an fp64 run), else float32."""
    wide = any(np.asarray(a).dtype == np.float64 for a in params.values())
    return "float64" if wide else "float32"


def _as_floats(params: Mapping[str, Any], dtype: str) -> dict[str, np.ndarray]:
    """Float tensors in ``dtype`` (float32 is the canonical one), others as they are."""
    out = {}
    for name, value in params.items():
        arr = np.asarray(value)
        out[name] = arr.astype(dtype, copy=False) if arr.dtype.kind == "f" else arr
    return out


def _shape_of(tensors: Mapping[str, np.ndarray], name: str) -> tuple[int, ...]:
    return tuple(np.shape(tensors[name])) if name in tensors else ()


def _names(items: list[str]) -> str:
    return name_list(items, _LIST_MAX)
