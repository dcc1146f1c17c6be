"""Writing canonical weights as any format, atomically: a neutral checkpoint (keeping a
checkpoint's whole training state), or a native file through the map of its model or the
generic rules: names as they are but for the leaves the format renames for a layer kind
(:class:`~polytrain.io.convert.rules.NameRule`), a 2-D tensor's layout from the map or
the layer kinds read with the weights."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.mismatch import compare_shapes
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io import native as native_io
from polytrain.io.checkpoint import save_checkpoint
from polytrain.io.convert.generic_write import generic_write_map
from polytrain.io.convert.planning import check_decided, merge_spec, user_side
from polytrain.io.convert.reading import Weights
from polytrain.io.convert.rules import (
    DTYPES,
    LIST_MAX,
    PathLike,
    as_floats,
    builtin_map,
    check_target,
    float_dtype,
    model_spec,
    shape_of,
)
from polytrain.io.name_map import NameMap, UserMap, load_map
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import ModelSpec


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
    check_target(to)
    if dtype not in (None, *DTYPES):
        raise ConfigError(f"Unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    if isinstance(weights, Weights):
        params, spec, ck = weights.params, model_spec(model) or weights.spec, weights.checkpoint
        own = float_dtype(params)
    else:  # plain arrays are canonical float32 unless ``dtype`` says otherwise
        params, spec, ck, own = dict(weights), model_spec(model), None, "float32"
    target = dtype or (own if to == NEUTRAL else "float32")
    if target != own and dtype is None and isinstance(weights, Weights):
        weights.notes.append(
            f"{own} weights (a --precision fp64 run) written as {target}, "
            "what native code expects; pass --dtype float64 to keep them"
        )
    params = as_floats(params, target)
    if spec is not None:
        shapes = {n: np.shape(a) for n, a in params.items()}
        problems = compare_shapes(spec.parameter_shapes(), shapes).describe(LIST_MAX)
        if problems:
            raise CheckpointError(f"The weights are not model {spec.name!r}: {problems}.")
    user = load_map(name_map) if name_map is not None else None
    if to == NEUTRAL:
        return _write_neutral(path, params, spec, ck, weights, target)
    kinds = weights.kinds if isinstance(weights, Weights) else {}
    nmap = map_for_writing(to, params, spec, user, other, kinds)
    if isinstance(weights, Weights):
        weights.notes.extend(nmap.notes)
    shapes = {n: shape_of(params, n) for n in nmap.entries}
    check_decided(
        nmap, f"writing {path}", "the weights (a state dict records no layer kinds)", shapes
    )
    native_io.write_native(path, to, nmap.to_native(params))
    return Path(path)


def map_for_writing(
    to: str,
    params: Mapping[str, np.ndarray],
    spec: ModelSpec | None,
    user: dict[str | None, UserMap] | None,
    other: str,
    kinds: Mapping[str, str],
) -> NameMap:
    """The map that writes ``params`` as ``to``: the built-in one (with the user's entries
    over it) for a model spec, else the user's entries over the generic rules."""
    side = user_side(to, user, other)
    if spec is not None:
        return merge_spec(builtin_map(spec, to), side, spec)
    return generic_write_map(to, params, side, kinds)


def _write_neutral(
    path: PathLike,
    params: dict[str, np.ndarray],
    spec: ModelSpec | None,
    ck: Any,
    weights: Any,
    dtype: str,
) -> Path:
    source = (
        {"format": weights.format, "path": str(weights.path)}
        if isinstance(weights, Weights)
        else {}
    )
    if ck is not None:  # neutral -> neutral keeps the whole training state
        return save_checkpoint(
            path,
            params=params,
            optimizer_state=ck.optimizer_state,
            spec=spec,
            model_name=ck.manifest["model"].get("name"),
            position=ck.position,
            seed=ck.manifest.get("seed"),
            recipe=ck.recipe,
            scaler=ck.scaler,
            history=ck.history,
            extra=ck.manifest.get("extra") or {},
            backend=ck.manifest["backend"].get("name"),
            framework_version=ck.manifest["backend"].get("framework_version"),
            param_dtype=dtype,
        )
    return save_checkpoint(
        path, params=params, spec=spec, extra={"converted_from": source}, param_dtype=dtype
    )
