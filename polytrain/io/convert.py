"""Convert weights between PyTorch, Paddle, MXNet and neutral checkpoints, without the
frameworks (writing a .pt needs torch). ``polytrain convert IN OUT --to FRAMEWORK``.

Canonical names and layout are PyTorch's (DESIGN.md contract 7). A :class:`NameMap` says,
for one framework, which native tensor holds each canonical one and whether it is stored
transposed. The maps of the built-in models follow from the spec and agree with what each
backend's ``save_native`` writes and ``load_native`` reads:

=======  ==========================================================================
torch    identical; BatchNorm also has ``num_batches_tracked`` (written as 0, ignored
         when read: the specs' fixed momentum never uses it); ``module.`` prefixes of
         DataParallel/DDP state dicts are removed
paddle   Linear ``weight`` is stored [in, out] (transposed); BatchNorm running_mean /
         running_var are ``_mean`` / ``_variance``
mxnet    BatchNorm weight / bias are ``gamma`` / ``beta``; Dense is [out, in] like torch
=======  ==========================================================================

For your own model, give a JSON map (``--map FILE``, or :func:`load_map` in Python)::

    {"features.0.weight": {"native": "conv1.weight"},
     "classifier.weight": {"native": "fc.weight", "transpose": true, "shape": [10, 980]},
     "classifier.bias": "fc.bias"}

Keys are canonical names (your PyTorch model's state-dict names); ``native`` is the
name in the other framework's file, ``transpose`` (default false) says it is stored
transposed (Paddle's Linear), ``shape`` (optional, canonical) is checked; a plain string
is short for ``{"native": ...}``. The map describes the Paddle or MXNet side of a
conversion (the PyTorch side is canonical); to convert between Paddle and MXNet give one
per framework: ``{"paddle": {...}, "mxnet": {...}}``. With ``--model`` too, the map
overrides the built-in entries it names. Without a model or a map, a model that is none
of the built-in ones converts by generic rules where those are safe: PyTorch and neutral
as they are; MXNet with gamma/beta renamed; Paddle with _mean/_variance renamed and, when
the file's name table says which weights belong to Linear layers, those transposed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.errors import CheckpointError, ConfigError, PolytrainError
from polytrain.io import native as native_io
from polytrain.io.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from polytrain.io.native import FRAMEWORKS, LABELS
from polytrain.neutral.models import (
    MODELS,
    BatchNorm2d,
    Linear,
    ModelSpec,
    get_model_spec,
    layer_parameters,
)

PathLike = str | os.PathLike[str]
TARGETS = (*FRAMEWORKS, "neutral")
DTYPES = ("float32", "float64")  # of the float tensors a conversion writes
_LIST_MAX = 6
_TORCH_IGNORED = ".num_batches_tracked"
_BN_NAMES = {
    "paddle": {"running_mean": "_mean", "running_var": "_variance"},
    "mxnet": {"weight": "gamma", "bias": "beta"},
}
_LAYOUT_NOTE = {
    "torch": "PyTorch layout",
    "paddle": "Paddle layout, Linear [in, out]",
    "mxnet": "MXNet layout",
}


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
    """canonical name -> :class:`MapEntry` for one framework, in model order.

    ``constants`` are native-only entries written as they are (torch's
    num_batches_tracked); native names ending in ``ignore`` are skipped when reading."""

    framework: str
    entries: dict[str, MapEntry]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    ignore: tuple[str, ...] = ()
    source: str = "built-in"

    def to_native(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Native tensors from canonical ones (every entry of the map must be given)."""
        _check_names(list(self.entries), list(params), "the weights", self.source)
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
        _check_names(expected, present, what, self.source)
        wrong = []
        for entry in self.entries.values():
            have = tuple(np.shape(tensors[entry.native]))
            if entry.shape is not None and have != entry.native_shape(entry.shape):
                wrong.append(f"{entry.native} {have} (expected {entry.native_shape(entry.shape)})")
        if wrong:
            raise CheckpointError(
                f"{what} does not fit {self.source} ({_LAYOUT_NOTE[self.framework]}): "
                f"wrong shape {_names(wrong)}."
            )
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
    """The map of a neutral spec for ``framework``, as that backend names and lays out
    the tensors in its native files."""
    _check_framework(framework)
    entries: dict[str, MapEntry] = {}
    constants: dict[str, np.ndarray] = {}
    for path, layer in spec.layers():
        for leaf, shape in layer_parameters(layer).items():
            native_leaf = leaf
            if isinstance(layer, BatchNorm2d):
                native_leaf = _BN_NAMES.get(framework, {}).get(leaf, leaf)
            transpose = framework == "paddle" and isinstance(layer, Linear) and leaf == "weight"
            entries[f"{path}.{leaf}"] = MapEntry(f"{path}.{native_leaf}", transpose, shape)
        if framework == "torch" and isinstance(layer, BatchNorm2d):
            constants[f"{path}{_TORCH_IGNORED}"] = np.array(0, dtype=np.int64)
    ignore = (_TORCH_IGNORED,) if framework == "torch" else ()
    return NameMap(framework, entries, constants, ignore, source=f"model {spec.name!r}")


def load_map(source: PathLike | Mapping[str, Any]) -> dict[str | None, dict[str, MapEntry]]:
    """Parse a user map (a JSON file or the same structure in Python). Returns the
    entries per framework; the key None holds a map that names no framework."""
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
    per_framework = set(data) <= set(FRAMEWORKS) and all(
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
    format: str  # torch, paddle, mxnet or neutral
    path: Path
    notes: list[str] = field(default_factory=list)
    checkpoint: Any = None  # the Checkpoint, when read from a neutral one


def read_weights(
    path: PathLike,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    other: str = "torch",
) -> Weights:
    """Canonical weights from a .pt, .pdparams, .params file or a neutral checkpoint
    (format detected by content). ``model`` (a built-in name or spec) and ``name_map`` say
    how names map (see the module docstring); ``other`` is the framework on the other
    side of a conversion, which decides what a map without framework keys describes."""
    fmt = native_io.detect_format(path)
    spec = _spec(model)
    user = load_map(name_map) if name_map is not None else None
    if fmt == "neutral":
        return _read_neutral(path, spec)
    tensors = native_io.READERS[fmt](path)
    if fmt == "torch" and tensors and all(k.startswith("module.") for k in tensors):
        tensors = {k.removeprefix("module."): v for k, v in tensors.items()}
    what = f"{path} ({LABELS[fmt]})"
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
            why = _difference(spec.parameter_shapes(), shapes) or "the same tensors, another name"
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
    have = {k: tuple(np.shape(v)) for k, v in tensors.items()}
    if fmt == "torch":
        have = {k: s for k, s in have.items() if not k.endswith(_TORCH_IGNORED)}
    out = []
    for name in MODELS:
        nmap = builtin_map(get_model_spec(name), fmt)
        want = {e.native: e.native_shape(e.shape or ()) for e in nmap.entries.values()}
        if want == have:
            out.append(name)
    return out


def _generic_map(fmt: str, tensors: Mapping[str, np.ndarray], path: PathLike,
                 notes: list[str]) -> NameMap:  # fmt: skip
    """A map for a model that is none of the built-in ones, by the safe generic rules."""
    entries = {}
    transposed = []
    table = native_io.paddle_name_table(path) if fmt == "paddle" else {}
    for native, value in tensors.items():
        if fmt == "torch" and native.endswith(_TORCH_IGNORED):
            continue
        head, _, leaf = native.rpartition(".")
        renames = {v: k for k, v in _BN_NAMES.get(fmt, {}).items()}
        canonical = f"{head}.{renames.get(leaf, leaf)}" if head else renames.get(leaf, leaf)
        transpose = False
        if fmt == "paddle" and np.ndim(value) == 2:
            if native not in table:
                raise CheckpointError(
                    f"{path} is not one of the built-in models ({', '.join(MODELS)}) and its "
                    f"2-D tensor {native!r} may be a Linear weight (stored transposed) or "
                    "not; the file has no name table to tell. Give --model NAME or --map "
                    "FILE (see docs/porting.md)."
                )
            transpose = table[native].startswith("linear_")
            if transpose:
                transposed.append(native)
        entries[canonical] = MapEntry(native, transpose)
    rule = {"torch": "as it is", "mxnet": "gamma/beta -> weight/bias"}.get(
        fmt, "_mean/_variance -> running_mean/running_var"
    )
    notes.append(f"not a built-in model: generic {fmt} rules ({rule})")
    if transposed:
        notes.append(f"transposed as Paddle Linear weights (name table): {_names(transposed)}")
    return NameMap(fmt, entries, ignore=_ignored(fmt), source=f"the generic {fmt} rules")


# -- writing --------------------------------------------------------------------------------------


def write_weights(
    path: PathLike,
    weights: Weights | Mapping[str, np.ndarray],
    to: str,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    other: str = "torch",
    dtype: str | None = None,
) -> Path:
    """Write canonical weights as ``to`` (torch, paddle, mxnet or neutral), atomically;
    for neutral ``path`` is a checkpoint directory. Nothing is written on any error.
    ``dtype`` (float32 or float64) is that of the float tensors written; by default
    float32 for the native formats (what ordinary framework code loads: Paddle refuses a
    float64 tensor for a float32 parameter) and the weights' own for a neutral checkpoint
    (float64 after a ``--precision fp64`` run)."""
    if to not in TARGETS:
        raise ConfigError(f"Unknown target {to!r}; use one of {', '.join(TARGETS)}.")
    if dtype not in (None, *DTYPES):
        raise ConfigError(f"Unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    if isinstance(weights, Weights):
        params, spec, ck = weights.params, _spec(model) or weights.spec, weights.checkpoint
        own = _float_dtype(params)
    else:  # plain arrays are canonical float32 unless ``dtype`` says otherwise
        params, spec, ck, own = dict(weights), _spec(model), None, "float32"
    target = dtype or (own if to == "neutral" else "float32")
    if target != own and dtype is None and isinstance(weights, Weights):
        weights.notes.append(
            f"{own} weights (a --precision fp64 run) written as {target}, "
            "what native code expects; pass --dtype float64 to keep them"
        )
    params = _as_floats(params, target)
    if spec is not None:
        problems = _difference(spec.parameter_shapes(), {n: np.shape(a) for n, a in params.items()})
        if problems:
            raise CheckpointError(f"The weights are not model {spec.name!r}: {problems}.")
    user = load_map(name_map) if name_map is not None else None
    if to == "neutral":
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
    if to == "paddle" and any(np.ndim(v) == 2 for v in params.values()):
        two_d = [k for k, v in params.items() if np.ndim(v) == 2]
        raise CheckpointError(
            f"Not one of the built-in models: cannot tell whether {_names(two_d)} are Linear "
            "weights (Paddle stores those transposed). Give --model NAME or --map FILE "
            "(see docs/porting.md)."
        )
    renames = _BN_NAMES.get(to, {}) if to == "mxnet" else {}
    entries = {}
    for name in params:
        head, _, leaf = name.rpartition(".")
        if to == "paddle":
            leaf = _BN_NAMES["paddle"].get(leaf, leaf)
        elif leaf in renames and _looks_like_norm(name, params):
            leaf = renames[leaf]
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
    if to not in TARGETS:
        raise ConfigError(f"Unknown target {to!r}; use one of {', '.join(TARGETS)}.")
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
        elif None in user and fw not in ("torch", "neutral"):
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
    return (_TORCH_IGNORED,) if fw == "torch" else ()


def _flat_map_side(fw: str, other: str) -> bool:
    """A map without framework keys describes the Paddle/MXNet side; between PyTorch
    and neutral, the PyTorch side."""
    if fw in ("paddle", "mxnet"):
        return other in ("torch", "neutral", fw)
    return fw == "torch" and other in ("torch", "neutral")


def _spec(model: str | ModelSpec | None) -> ModelSpec | None:
    if model is None or isinstance(model, ModelSpec):
        return model
    return get_model_spec(model)


def _check_framework(framework: str) -> None:
    if framework not in FRAMEWORKS:
        raise ConfigError(f"Unknown framework {framework!r}; use one of {', '.join(FRAMEWORKS)}.")


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
    more = f" and {len(items) - _LIST_MAX} more" if len(items) > _LIST_MAX else ""
    return ", ".join(items[:_LIST_MAX]) + more


def _check_names(expected: list[str], present: list[str], what: str, by: str) -> None:
    missing = [n for n in expected if n not in present]
    unexpected = [n for n in present if n not in expected]
    if missing or unexpected:
        parts = [f"missing {_names(missing)}"] if missing else []
        parts += [f"unexpected {_names(unexpected)}"] if unexpected else []
        raise CheckpointError(f"{what} does not match {by}: {'; '.join(parts)}.")


def _difference(want: Mapping[str, Any], have: Mapping[str, Any]) -> str:
    missing = [n for n in want if n not in have]
    unexpected = [n for n in have if n not in want]
    wrong = [
        f"{n} {tuple(have[n])} (expected {tuple(want[n])})"
        for n in want
        if n in have and tuple(have[n]) != tuple(want[n])
    ]
    parts = [f"missing {_names(missing)}"] if missing else []
    parts += [f"unexpected {_names(unexpected)}"] if unexpected else []
    parts += [f"wrong shape {_names(wrong)}"] if wrong else []
    return "; ".join(parts)
