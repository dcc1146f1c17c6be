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

For your own model, give a JSON map (``--map FILE``, or :func:`load_map` in Python)::

    {"features.0.weight": {"native": "conv1.weight"},
     "classifier.weight": {"native": "fc.weight", "transpose": true, "shape": [10, 980]},
     "classifier.bias": "fc.bias"}

Keys are canonical names (your PyTorch model's state-dict names); ``native`` is the
name in the other format's file, ``transpose`` (default false) says it is stored
transposed (Paddle's Linear), ``shape`` (optional, canonical) is checked; a plain string
is short for ``{"native": ...}``. The map describes the non-canonical side of a
conversion (the PyTorch side is canonical); to convert between two non-canonical formats
give one per format: ``{"paddle": {...}, "mxnet": {...}}``. With ``--model`` too, the map
overrides the built-in entries it names. Without a model or a map, a model that is none
of the built-in ones converts by generic rules where those are safe: canonical formats
and neutral as they are; the others with their renames undone (MXNet gamma/beta, Paddle
_mean/_variance) and, where a format stores some layer's weights transposed, only when
the file's own name table says which 2-D tensors those are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_names, compare_shapes, name_list
from polytrain.backend.native_format import NativeFormat
from polytrain.errors import CheckpointError, ConfigError, PolytrainError
from polytrain.io import native as native_io
from polytrain.io.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import (
    MODELS,
    BatchNorm2d,
    ModelSpec,
    get_model_spec,
    layer_parameters,
)

PathLike = str | os.PathLike[str]
DTYPES = ("float32", "float64")  # of the float tensors a conversion writes
_LIST_MAX = 6
_NORM = BatchNorm2d.__name__  # the layer kind the generic rules recognise (running stats)


# -- maps -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapEntry:
    """Where one canonical tensor lives in a native file."""

    native: str
    transpose: bool = False
    shape: tuple[int, ...] | None = None  # canonical shape, checked when given

    def native_shape(self, canonical: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(reversed(canonical)) if self.transpose else tuple(canonical)


@dataclass
class NameMap:
    """canonical name -> :class:`MapEntry` for one format (``framework``: its name), in
    model order.

    ``constants`` are native-only entries written as they are (PyTorch's
    num_batches_tracked); native names ending in ``ignore`` are skipped when reading."""

    framework: str
    entries: dict[str, MapEntry]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    ignore: tuple[str, ...] = ()
    source: str = "built-in"

    def to_native(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Native tensors from canonical ones (every entry of the map must be given)."""
        compare_names(self.entries, params).check(
            f"the weights does not match {self.source}", _LIST_MAX
        )
        out: dict[str, np.ndarray] = {}
        for name, entry in self.entries.items():
            value = np.asarray(params[name])
            out[entry.native] = np.ascontiguousarray(value.T if entry.transpose else value)
        out.update(self.constants)
        return out

    def to_canonical(self, tensors: Mapping[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
        """Canonical tensors from native ones; missing, unexpected or misshapen entries are
        one CheckpointError naming them in the file's own terms."""
        present = [k for k in tensors if not (self.ignore and k.endswith(self.ignore))]
        expected = [e.native for e in self.entries.values()]
        compare_names(expected, present).check(f"{what} does not match {self.source}", _LIST_MAX)
        want = {
            e.native: e.native_shape(e.shape) for e in self.entries.values() if e.shape is not None
        }
        wrong = compare_shapes(want, {n: tuple(np.shape(tensors[n])) for n in want})
        if wrong:
            note = native_io.get_format(self.framework).layout.note
            wrong.check(f"{what} does not fit {self.source} ({note})", _LIST_MAX)
        out = {}
        for name, entry in self.entries.items():
            value = np.asarray(tensors[entry.native])
            out[name] = np.ascontiguousarray(value.T if entry.transpose else value)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of this map (the format of ``--map``)."""
        return {
            name: {"native": e.native, "transpose": e.transpose}
            | ({"shape": list(e.shape)} if e.shape is not None else {})
            for name, e in self.entries.items()
        }


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
            entries[f"{path}.{leaf}"] = MapEntry(native, layout.is_transposed(kind, leaf), shape)
        for leaf, value in layout.constants.get(kind, {}).items():
            constants[f"{path}.{leaf}"] = value
    ignore = layout.ignored_suffixes
    return NameMap(framework, entries, constants, ignore, source=f"model {spec.name!r}")


def load_map(source: PathLike | Mapping[str, Any]) -> dict[str | None, dict[str, MapEntry]]:
    """Parse a user map (a JSON file or the same structure in Python). Returns the
    entries per format; the key None holds a map that names no format."""
    what = "the map"
    if isinstance(source, Mapping):
        data: Any = source
    else:
        what = f"map file {source}"
        try:
            data = json.loads(Path(source).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"Cannot read {what}: {exc.strerror or exc}.") from exc
        except ValueError as exc:
            raise ConfigError(f"{what} is not valid JSON: {exc}.") from exc
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{what} must be a non-empty JSON object {{canonical name: entry}}.")
    per_framework = set(data) <= set(native_io.formats()) and all(
        isinstance(v, Mapping) and "native" not in v for v in data.values()
    )
    if per_framework:
        return {fw: _parse_entries(entries, f"{what} [{fw}]") for fw, entries in data.items()}
    return {None: _parse_entries(data, what)}


def _parse_entries(data: Any, what: str) -> dict[str, MapEntry]:
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"{what} must be a non-empty object {{canonical name: entry}}.")
    out = {}
    for name, value in data.items():
        if isinstance(value, str):
            value = {"native": value}
        try:
            if not isinstance(value, Mapping) or not isinstance(value["native"], str):
                raise TypeError("needs 'native': a name")
            unknown = set(value) - {"native", "transpose", "shape"}
            if unknown:
                raise TypeError(f"unknown keys {sorted(unknown)}")
            shape = value.get("shape")
            out[str(name)] = MapEntry(
                value["native"],
                bool(value.get("transpose", False)),
                None if shape is None else tuple(int(s) for s in shape),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{what}: entry {name!r} is {value!r}; write "
                '{"native": "name in the file", "transpose": false} or just "name in the file" '
                f"({exc})."
            ) from None
    natives = [e.native for e in out.values()]
    dupes = sorted({n for n in natives if natives.count(n) > 1})
    if dupes:
        raise ConfigError(f"{what} maps several canonical names to {_names(dupes)}.")
    return out


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
    fmt = native_io.detect_format(path)
    spec = _spec(model)
    user = load_map(name_map) if name_map is not None else None
    if fmt == NEUTRAL:
        return _read_neutral(path, spec)
    declared = native_io.get_format(fmt)
    tensors = declared.read(path)
    for prefix in declared.layout.strip_prefixes:
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    what = f"{path} ({declared.label})"
    notes: list[str] = []
    if spec is None and user is None:
        spec = _detect_model(fmt, tensors, notes)
    nmap = _map_for(fmt, spec, user, other)
    if nmap is None:
        nmap = _generic_map(fmt, tensors, path, notes)
    try:
        params = nmap.to_canonical(tensors, what)
    except CheckpointError as exc:
        found = _matching_models(fmt, tensors) if user is None else []
        if not found:
            raise
        raise CheckpointError(
            f"{exc} It holds model {found[0]!r}: pass --model {found[0]}."
        ) from None
    return Weights(_as_floats(params, "float32"), spec, fmt, Path(path), notes)


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


def _generic_map(fmt: str, tensors: Mapping[str, np.ndarray], path: PathLike,
                 notes: list[str]) -> NameMap:  # fmt: skip
    """A map for a model that is none of the built-in ones, by the safe generic rules:
    the format's renames undone on every leaf; where it stores some layer kinds' weights
    transposed, every 2-D tensor's kind must come from the file itself."""
    declared = native_io.get_format(fmt)
    layout = declared.layout
    renames = layout.canonical_leaves()
    transposing = _kinds(declared)  # the layer kinds it stores transposed, if any
    kinds = declared.layer_kinds(path) if transposing else None
    entries = {}
    transposed = []
    for native, value in tensors.items():
        if native.endswith(layout.ignored_suffixes):
            continue
        head, _, leaf = native.rpartition(".")
        canonical = f"{head}.{renames.get(leaf, leaf)}" if head else renames.get(leaf, leaf)
        transpose = False
        if transposing and np.ndim(value) == 2:
            if kinds is None or native not in kinds:
                raise CheckpointError(
                    f"{path} is not one of the built-in models ({', '.join(MODELS)}) and its "
                    f"2-D tensor {native!r} may be a {transposing} weight (stored "
                    "transposed) or not; the file has no name table to tell. Give --model "
                    "NAME or --map FILE (see docs/porting.md)."
                )
            transpose = layout.is_transposed(kinds[native], renames.get(leaf, leaf))
            if transpose:
                transposed.append(native)
        entries[canonical] = MapEntry(native, transpose)
    rule = "as it is"
    if renames:
        rule = f"{'/'.join(renames)} -> {'/'.join(renames.values())}"
    notes.append(f"not a built-in model: generic {fmt} rules ({rule})")
    if transposed:
        notes.append(
            f"transposed as {transposing} weights (the file's name table): {_names(transposed)}"
        )
    return NameMap(fmt, entries, ignore=layout.ignored_suffixes, source=f"the generic {fmt} rules")


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
    nmap = _map_for(to, spec, user, other)
    if nmap is None:
        nmap = _generic_write_map(to, params)
    native_io.write_native(path, to, nmap.to_native(params))
    return Path(path)


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


def _generic_write_map(to: str, params: Mapping[str, np.ndarray]) -> NameMap:
    declared = native_io.get_format(to)
    layout = declared.layout
    two_d = [k for k, v in params.items() if np.ndim(v) == 2]
    if _kinds(declared) and two_d:
        raise CheckpointError(
            f"Not one of the built-in models: cannot tell whether {_names(two_d)} are "
            f"{_kinds(declared)} weights ({declared.label} stores those transposed). Give "
            "--model NAME or --map FILE (see docs/porting.md)."
        )
    entries = {}
    for name in params:
        head, _, leaf = name.rpartition(".")
        if _looks_like_norm(name, params):
            leaf = layout.native_leaf(_NORM, leaf)
        entries[name] = MapEntry(f"{head}.{leaf}" if head else leaf)
    return NameMap(to, entries, source=f"the generic {to} rules")


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
    :class:`~polytrain.errors.PolytrainError`; ``target`` is then untouched."""
    _check_target(to)
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


# -- helpers --------------------------------------------------------------------------------------


def _map_for(
    fw: str, spec: ModelSpec | None, user: dict[str | None, dict[str, MapEntry]] | None, other: str
) -> NameMap | None:
    """The map for the ``fw`` side of a conversion whose other side is ``other``."""
    entries = None
    if user is not None:
        if fw in user:
            entries = user[fw]
        elif None in user and _flat_map_side(fw, other):
            entries = user[None]
        elif None in user and not _canonical(fw):
            raise ConfigError(
                f"The map names no framework, and both sides ({fw} and {other}) need one: "
                f'write it as {{"{fw}": {{...}}, "{other}": {{...}}}}.'
            )
    base = builtin_map(spec, fw) if spec is not None else None
    if entries is None:
        if base is not None or user is None:
            return base
        names = next(iter(user.values()))  # identity over the canonical names of the map
        identity = {n: MapEntry(n, False, e.shape) for n, e in names.items()}
        return NameMap(fw, identity, ignore=_ignored(fw), source="the names of the map")
    if base is None or spec is None:
        return NameMap(fw, dict(entries), ignore=_ignored(fw), source="the map")
    unknown = [n for n in entries if n not in base.entries]
    if unknown:
        raise ConfigError(f"The map names {_names(unknown)}, which model {spec.name!r} lacks.")
    merged = {
        n: MapEntry(entries[n].native, entries[n].transpose, e.shape) if n in entries else e
        for n, e in base.entries.items()
    }
    source = f"model {spec.name!r} with the map"
    return NameMap(fw, merged, base.constants, base.ignore, source=source)


def _ignored(fw: str) -> tuple[str, ...]:
    return () if fw == NEUTRAL else native_io.get_format(fw).layout.ignored_suffixes


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
    return get_model_spec(model)


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


def _names(items: list[str]) -> str:
    return name_list(items, _LIST_MAX)
