"""Reading weights from any format as canonical ones: a neutral checkpoint as it is; a
native file through the map of its model (detected from its names and shapes, or given)
or, for a model that is none of the built-in ones, the generic rules: the format's leaf
renames undone (:class:`~polytrain.io.convert.rules.NameRule`), a 2-D tensor's layout
from the map or from what the file itself records about its layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_shapes
from polytrain.errors import CheckpointError
from polytrain.io import native as native_io
from polytrain.io.checkpoint import find_checkpoint, load_checkpoint
from polytrain.io.convert.generic_read import generic_read_map
from polytrain.io.convert.planning import check_decided, merge_spec, user_side
from polytrain.io.convert.rules import (
    LIST_MAX,
    PathLike,
    as_floats,
    builtin_map,
    float_dtype,
    model_spec,
    shape_of,
)
from polytrain.io.name_map import NameMap, load_map
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import MODELS, ModelSpec, get_model_spec


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
    return read(path, model_spec(model), name_map, other)[0]


def read_weights_with_map(
    path: PathLike,
    *,
    model: str | ModelSpec | None = None,
    name_map: PathLike | Mapping[str, Any] | None = None,
    other: str = NEUTRAL,
) -> tuple[Weights, NameMap | None]:
    """:func:`read_weights` and the map that read them (None for a neutral checkpoint)."""
    return read(path, model_spec(model), name_map, other)


def read(
    path: PathLike,
    spec: ModelSpec | None,
    name_map: PathLike | Mapping[str, Any] | None,
    other: str,
    *,
    decided: bool = True,
) -> tuple[Weights, NameMap | None]:
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
    side = user_side(fmt, user, other)
    if spec is not None:
        nmap = merge_spec(builtin_map(spec, fmt), side, spec)
    else:
        nmap = generic_read_map(fmt, tensors, path, side, notes)
    if decided:
        shapes = {n: shape_of(tensors, e.native) for n, e in nmap.entries.items()}
        check_decided(nmap, what, declared.layer_evidence, shapes)
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
    floats = float_dtype(params)  # a float64 file stays float64 until the writer decides
    weights = Weights(as_floats(params, floats), spec, fmt, Path(path), notes, kinds=kinds)
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
                compare_shapes(spec.parameter_shapes(), shapes).describe(LIST_MAX)
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
