"""``polytrain convert``: read, then write (:func:`convert`, its report and the inputs it
must not overwrite), and ``--print-map``: the map it would use (:func:`plan_map`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.errors import CheckpointError, PolytrainError
from polytrain.io.checkpoint import find_checkpoint
from polytrain.io.convert.planning import flat_map_side
from polytrain.io.convert.reading import read, read_weights
from polytrain.io.convert.rules import PathLike, check_target, listed, model_spec
from polytrain.io.convert.writing import map_for_writing, write_weights
from polytrain.io.name_map import NameMap, load_map
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import ModelSpec
from polytrain.utils.output_paths import folder_inputs, refuse_overwriting_inputs


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
    check_target(to)
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
    check_target(to)
    try:
        weights, read_map = read(source, model_spec(model), name_map, to, decided=False)
        user = load_map(name_map) if name_map is not None else None
        write_map = None
        if to != NEUTRAL:
            spec = model_spec(model) or weights.spec
            write_map = map_for_writing(
                to, weights.params, spec, user, weights.format, weights.kinds
            )
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
            f"(true for a weight stored transposed, false for any other): {listed(undecided)}"
        )
    others = {weights.format: to, to: weights.format}
    flat = [fw for fw in maps if flat_map_side(fw, others[fw])]
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
