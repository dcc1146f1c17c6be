"""``polytrain.port``: walk both models, pair their layers, load the source's tensors into the
target, run both on the same input and compare them layer by layer."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.model_walker import BARE, ModelWalker
from polytrain.backend.native_format import PathLike
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io import native as native_io
from polytrain.io.name_map import UNVERIFIED
from polytrain.plugins.registry import registered_model_walkers
from polytrain.porting.blocks import check_blocks
from polytrain.porting.match import Pair, derived_map, match_layers, ported_state
from polytrain.porting.verify import Verification, check_as_linear, compare_traces
from polytrain.utils.fileio import atomic_write_bytes
from polytrain.utils.output_paths import refuse_overwriting_inputs
from polytrain.utils.user_code import call_user
from polytrain.utils.user_files import read_array
from polytrain.utils.user_import import import_user_module

DEFAULT_TOLERANCE = 1e-4


@dataclass
class PortResult:
    """What :func:`port` did: the target's state (native names), the map (target name ->
    source tensor), the source layers a hint left out, target entries kept as they were,
    the verification, and what the target must reproduce that no tensor shows (notes)."""

    source_framework: str
    target_framework: str
    pairs: list[Pair]
    state: dict[str, np.ndarray]
    name_map: dict[str, dict[str, Any]]
    left_out: list[str]
    kept: list[str]
    verification: Verification
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verification.passed

    def map_json(self) -> dict[str, Any]:
        """The map as ``polytrain convert --map`` reads it (per source format). A port that
        failed verification marks it ``unverified`` with the reason: ``convert`` refuses such
        a map until the user has checked it and deleted that key."""
        found: dict[str, Any] = {self.source_framework: self.name_map}
        first = self.verification.first_failure
        if not self.passed:
            off = first and (first.problem or f"relative {first.relative:.3g}")
            why = f"layer {first.layer}: {off}" if first else "no layer compared"
            found = {UNVERIFIED: f"polytrain port failed verification: {why}", **found}
        return found

    def report(self) -> dict[str, Any]:
        return {
            "source": self.source_framework,
            "target": self.target_framework,
            "layers_ported": len(self.pairs),
            "hinted": [f"{p.source.name}={p.target.name}" for p in self.pairs if p.hinted],
            "left_out": self.left_out,
            "kept_from_target": self.kept,
            "notes": self.notes,
            "verification": self.verification.to_dict(),
        }

    def format(self) -> str:
        head = (
            f"ported {len(self.pairs)} layers, {len(self.name_map)} tensors, "
            f"{self.source_framework} -> {self.target_framework}"
        )
        notes = [f"note: {note}" for note in self.notes]
        if self.left_out:
            notes.append(f"left out (hints): {', '.join(self.left_out)}")
        if self.kept:
            notes.append(f"kept from the target: {', '.join(self.kept[:6])}")
        return "\n".join([head, *notes, self.verification.format()])


def load_object(spec: str) -> Any:
    """``pkg.module:factory`` imported and called with no arguments."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{spec!r} is not pkg.module:factory (e.g. mymodels:build_resnet18).")
    try:
        module = import_user_module(module_name, repr(spec))
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ConfigError(f"{module_name} has no {attr!r} (from {spec!r}).")
        factory = getattr(factory, part)
    return call_user(factory, repr(spec)) if callable(factory) else factory


def walker_for(model: Any, what: str) -> ModelWalker:
    """The registered walker that owns ``model``; a ConfigError says what it is otherwise."""
    walkers = registered_model_walkers()
    for walker in walkers.values():
        if walker.owns(model):
            return walker
    known = ", ".join(walkers) or "none (no backend plugin is installed)"
    raise ConfigError(
        f"The {what} is a {type(model).__module__}.{type(model).__name__}, not a model object "
        f"of a framework polytrain can walk ({known})."
    )


def make_inputs(
    input_shape: Sequence[int] | None, inputs: np.ndarray | PathLike | None, seed: int
) -> np.ndarray:
    """The verification batch: a user's array (or .npy file, numbers only: never a
    pickle) or standard normal float32."""
    if isinstance(inputs, str | os.PathLike):
        return read_array(inputs, "the input batch (--input)")
    if inputs is not None:
        return np.asarray(inputs)
    if not input_shape:
        raise ConfigError(
            "Verification needs an input: give its shape (--input-shape 1,3,224,224) or a "
            "batch (--input batch.npy)."
        )
    return np.random.default_rng(seed).standard_normal(tuple(input_shape)).astype(np.float32)


def load_weights(walker: ModelWalker, model: Any, path: PathLike) -> None:
    """Load the weights file ``path`` into ``model``: read as data by polytrain's reader of
    its format (never the framework's loader, which would unpickle it), then handed to the
    walker as tensors. The file must be in the model's own framework's format."""
    found, tensors = native_io.read_native(path)
    if found != walker.framework:
        label = native_io.get_format(found).label
        raise CheckpointError(
            f"{os.fspath(path)} (--weights) is a {label} file, but the source model is a "
            f"{walker.framework} model: convert it first (polytrain convert "
            f"{os.fspath(path)} OUT --to {walker.framework})."
        )
    walker.load_saved(model, tensors, f"{os.fspath(path)} (--weights)")


def _module_files(source: Any, target: Any) -> dict[str, str | None]:
    """The file of the module of each model given as ``pkg.module:factory`` (an input too)."""
    found: dict[str, str | None] = {}
    for role, spec in (("SOURCE", source), ("TARGET", target)):
        if isinstance(spec, str):
            module = sys.modules.get(spec.partition(":")[0])
            found[f"{role} (the module of {spec})"] = getattr(module, "__file__", None)
    return found


def port(
    source: Any,
    target: Any,
    *,
    input_shape: Sequence[int] | None = None,
    inputs: np.ndarray | PathLike | None = None,
    hints: Mapping[str, str | None] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    weights: PathLike | None = None,
    out: PathLike | None = None,
    map_out: PathLike | None = None,
    report_out: PathLike | None = None,
    seed: int = 0,
) -> PortResult:
    """Port ``source``'s weights into ``target`` (model objects, or ``pkg.module:factory``
    strings; ``weights`` is loaded into the source first) and verify on one batch.

    The target object holds the ported weights afterwards. ``out`` (the target's native
    file) is written only when verification passes; ``map_out`` and ``report_out`` (JSON)
    always. Check ``result.passed``. An output that is one of the inputs (the weights, the
    batch, a model's module; a hard link or symlink counts) is refused before anything
    is written. Options of transformer and attention blocks that no tensor shows are
    compared first (:mod:`polytrain.porting.blocks`): one that changes the outputs and
    differs is a ConfigError."""
    outputs = {"the output": out, "--map-out": map_out, "--report": report_out}
    batch_file = inputs if isinstance(inputs, str | os.PathLike) else None
    given = {"--weights": weights, "--input": batch_file}
    refuse_overwriting_inputs(outputs, given)
    src_model = load_object(source) if isinstance(source, str) else source
    tgt_model = load_object(target) if isinstance(target, str) else target
    refuse_overwriting_inputs(outputs, _module_files(source, target))
    src_walker = walker_for(src_model, "source")
    tgt_walker = walker_for(tgt_model, "target")
    if weights is not None:
        load_weights(src_walker, src_model, weights)
    batch = make_inputs(input_shape, inputs, seed)
    if inputs is None:  # the random batch in the source model's float type (a float64 model)
        floats = [a.dtype for a in src_walker.state(src_model).values() if a.dtype.kind == "f"]
        batch = batch.astype(floats[0]) if floats else batch
    notes = check_blocks(src_walker.blocks(src_model), tgt_walker.blocks(tgt_model))
    src_trace = src_walker.trace(src_model, batch)
    pairs, left_out = match_layers(
        src_walker.layers(src_model), tgt_walker.layers(tgt_model), hints
    )
    notes += _pairing_notes(pairs)
    state, kept = ported_state(pairs, tgt_walker.state(tgt_model))
    tgt_walker.load_state(tgt_model, state)
    tgt_trace = tgt_walker.trace(tgt_model, batch)
    check_as_linear(pairs, src_trace, tgt_trace)
    result = PortResult(
        src_walker.framework,
        tgt_walker.framework,
        pairs,
        state,
        derived_map(pairs),
        left_out,
        kept,
        compare_traces(pairs, src_trace, tgt_trace, tolerance),
        [*src_walker.notes(src_model), *notes],
    )
    if map_out is not None:
        _write_json(map_out, result.map_json())
    if report_out is not None:
        _write_json(report_out, result.report())
    if out is not None and result.passed:
        native_io.write_native(out, tgt_walker.framework, state)
    return result


def _pairing_notes(pairs: Sequence[Pair]) -> list[str]:
    """Notes on pairs made out of registration order and on bare parameters (not traced)."""
    found = []
    moved = [f"{p.source.name}={p.target.name}" for p in pairs if p.reordered]
    bare = [p.source.name for p in pairs if BARE in (p.source.kind, p.target.kind)]
    for names, what in (
        (moved, "paired out of registration order (the outputs compared check it)"),
        (bare, "bare parameters, which no layer of their own runs, are not traced (the "
         "layers after them check them)"),
    ):  # fmt: skip
        if names:
            found.append(f"{what}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}")
    return found


def _write_json(path: PathLike, data: Any) -> None:
    atomic_write_bytes(Path(path), (json.dumps(data, indent=1) + "\n").encode("utf-8"))
