"""Name maps of the model zoos' own models, without the model objects:
``polytrain convert model.pdparams out.pt --to torch --zoo paddle:densenet121``.

polytrain ships, as package data (``zoo_maps/``), the maps ``polytrain port`` derived for
every model of Paddle's ``paddle.vision.models`` and Gluon's
``mxnet.gluon.model_zoo.vision`` that has a torchvision twin (the same computation), each
verified when it was generated (``python -m benchmarks.zoo_maps``: the port's per-layer
check, then this conversion of the model's saved file into the real torchvision model,
logits compared). A map file lists torchvision's state dict in its order, each tensor
with its shape and the tensor of the zoo model's file that fills it (``index.json`` says
which zoo models have no twin, and why).

A file is converted with a zoo map only when its names and shapes are the zoo model's,
the classifier's class count aside (a fine-tuned head): anything else is one
CheckpointError naming what differs. The other direction, a torchvision state dict
(``.pt``) into the zoo model's format, takes the same map.

Named NLP models (``paddlenlp:bert``, ``paddlenlp:ernie``, ``gluonnlp:bert``) have one
template per family instead, expanded for the file's size (polytrain/io/zoo_templates.py).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.mismatch import Mismatch, compare_shapes, name_list
from polytrain.backend.native_format import PathLike
from polytrain.errors import CheckpointError, ConfigError
from polytrain.io import native as native_io
from polytrain.io.convert import ConvertReport, convert
from polytrain.io.native import NEUTRAL
from polytrain.io.zoo_map import ZooMap, ZooTensor
from polytrain.io.zoo_templates import ZooTemplate, read_template, template_index

INDEX = "index.json"  # {"zoos": {prefix: {"format", "label"}}, "maps": {...}, "no_twin": {...}}
_LIST_MAX = 6


# -- the shipped maps ----------------------------------------------------------------------------


def maps_folder() -> Path:
    """Where the shipped maps are (package data)."""
    return Path(str(resources.files("polytrain.io").joinpath("zoo_maps")))


@dataclass(frozen=True)
class Zoo:
    """A model zoo the maps cover: its prefix in ``--zoo`` (``paddle``, ``gluon``), the
    format of its models' files, and how messages name it."""

    prefix: str
    format: str
    label: str


def zoos(folder: Path | None = None) -> dict[str, Zoo]:
    """The zoos of the shipped maps and templates, by prefix."""
    where = folder or maps_folder()
    found = _index(where).get("zoos", {}) | template_index(where).get("zoos", {})
    return {p: Zoo(p, str(z["format"]), str(z["label"])) for p, z in found.items()}


def zoo_names(folder: Path | None = None) -> list[str]:
    """The zoo models polytrain has maps for, as ``zoo:name``."""
    index = _index(folder or maps_folder())
    return list(index.get("maps", {}))


def load_zoo(key: str, folder: Path | None = None) -> ZooMap | ZooTemplate:
    """The shipped map of ``key``, or the template of a named NLP model
    (``paddlenlp:bert``), expanded for a file by :func:`plan_zoo`."""
    where = folder or maps_folder()
    known = zoos(where)
    zoo, name = _split_key(key, known)
    full = f"{zoo.prefix}:{name}"
    templates = template_index(where).get("templates", {})
    if full in templates:
        return read_template(where / templates[full]["file"], full, zoo.format, zoo.label)
    return load_zoo_map(key, folder)


def load_zoo_map(key: str, folder: Path | None = None) -> ZooMap:
    """The shipped map of ``key`` (``paddle:densenet121``, ``gluon:resnet18_v1``); a
    ConfigError for a name polytrain has no map for, saying why where it knows."""
    where = folder or maps_folder()
    index = _index(where)
    zoo, name = _split_key(key, zoos(where))
    full = f"{zoo.prefix}:{name}"
    maps, no_twin = index.get("maps", {}), index.get("no_twin", {})
    named = _template_keys(where)
    if full in maps:
        return _read_map(where / maps[full]["file"], full, zoo)
    if full in no_twin:
        raise ConfigError(
            f"--zoo {full}: polytrain has no map for it: {no_twin[full]} Port it into a "
            "PyTorch model of your own with polytrain port (docs/porting.md)."
        )
    close = difflib.get_close_matches(full, [*maps, *no_twin, *named], n=3, cutoff=0.75)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(f"--zoo {key!r} is no zoo model polytrain has a map for{hint}; "
                      f"it has maps for {_known([*maps, *named], zoos(where))}.")  # fmt: skip


def _template_keys(folder: Path) -> list[str]:
    return list(template_index(folder).get("templates", {}))


def _split_key(key: str, known: Mapping[str, Zoo]) -> tuple[Zoo, str]:
    """(the zoo, the model's name) of ``key``; a zoo's file format names it too
    (``mxnet:`` for ``gluon:``)."""
    prefix, sep, name = key.strip().partition(":")
    by_format = {zoo.format: zoo for zoo in reversed(list(known.values()))}  # the first
    zoo = known.get(prefix.lower()) or by_format.get(prefix.lower())
    if not sep or zoo is None or not name:
        raise ConfigError(
            f"--zoo {key!r} is not ZOO:MODEL with ZOO one of {', '.join(known)} (e.g. "
            f"paddle:densenet121, gluon:resnet18_v1)."
        )
    return zoo, name.lower()


def _known(keys: list[str], known: Mapping[str, Zoo]) -> str:
    """``paddle: a, b; gluon: c`` (docs/porting.md has the table)."""
    groups = []
    for zoo in known:
        names = [k.partition(":")[2] for k in keys if k.startswith(zoo + ":")]
        if names:
            groups.append(f"{zoo}: {', '.join(names)}")
    return "; ".join(groups) or "none (the package data is missing)"


def _index(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"The zoo maps' index {folder / INDEX} cannot be read: {exc}.") from None
    return data if isinstance(data, dict) else {}


def _read_map(path: Path, key: str, zoo: Zoo) -> ZooMap:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        tensors = tuple(_tensor(row) for row in data["tensors"])
        return ZooMap(
            key, zoo.format, zoo.label, data["source"], data["torchvision"],
            int(data["classes"]), tuple(data["head"]), tensors, data.get("verified", {}),
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"The zoo map {path} cannot be read: {exc}.") from None


def _tensor(row: list[Any]) -> ZooTensor:
    """``[name, shape]`` or ``[name, shape, native]`` or ``[name, shape, native, "transposed"]``."""
    name, shape, *rest = row
    native = rest[0] if rest else None
    transposed = len(rest) > 1 and rest[1] == "transposed"
    return ZooTensor(str(name), tuple(int(s) for s in shape), native, transposed)


# -- checking a file against a map ---------------------------------------------------------------


def file_classes(zmap: ZooMap, shapes: Mapping[str, tuple[int, ...]], what: str, *,
                 native: bool) -> int:  # fmt: skip
    """The class count of the model whose file has these tensors (native names and shapes
    when ``native``, else torchvision's); a CheckpointError names what differs otherwise."""
    expected = zmap.native_shapes(zmap.classes) if native else zmap.target_shapes(zmap.classes)
    optional = set() if native else {t.name for t in zmap.tensors if t.native is None}
    mismatch = compare_shapes(expected, shapes)
    if not native:  # a torchvision file may leave num_batches_tracked out
        missing = tuple(n for n in mismatch.missing if n not in optional)
        mismatch = Mismatch(missing, mismatch.unexpected, mismatch.wrong_shape)
    if not mismatch:
        return zmap.classes
    classes = _head_classes(zmap, mismatch, native)
    if classes is not None:
        return classes
    side = f"{zmap.label} {zmap.key.partition(':')[2]}" if native else zmap.twin
    raise CheckpointError(
        f"{what} does not hold {side} as the zoo map {zmap.key} has it: "
        f"{mismatch.describe(_LIST_MAX)}. A model of your own: derive its map with "
        "polytrain port (docs/porting.md)."
    )


def _head_classes(zmap: ZooMap, mismatch: Mismatch, native: bool) -> int | None:
    """The class count when the only difference is the classifier's (every head tensor's
    first canonical dimension the same other number), else None."""
    if mismatch.missing or mismatch.unexpected:
        return None
    heads = {t.native if native else t.name: t for t in zmap.tensors if t.name in zmap.head}
    counts = set()
    for wrong in mismatch.wrong_shape:
        tensor = heads.get(wrong.name)
        if tensor is None or not wrong.found:
            return None
        canonical = wrong.found[::-1] if native and tensor.transposed else wrong.found
        if tuple(canonical[1:]) != tensor.shape[1:]:
            return None
        counts.add(canonical[0])
    if len(counts) != 1 or len(mismatch.wrong_shape) != len(heads):
        return None
    return counts.pop()


# -- converting --------------------------------------------------------------------------------


def convert_zoo(
    source: PathLike,
    target: PathLike,
    to: str,
    zoo: str,
    *,
    dtype: str | None = None,
    folder: Path | None = None,
) -> ConvertReport:
    """:func:`~polytrain.io.convert.convert` with the shipped map of ``zoo``: a file of
    the zoo model into torchvision's names (``--to torch``, neutral or another canonical
    format), or a torchvision file into the zoo model's format. The file is checked
    against the map first."""
    zmap, classes, name_map = plan_zoo(source, to, load_zoo(zoo, folder))
    report = convert(source, target, to, name_map=name_map, dtype=dtype)
    report.notes[:] = with_zoo_notes(zoo_notes(zmap, classes), report.notes)
    return report


def with_zoo_notes(zoo: list[str], notes: list[str]) -> list[str]:
    """A zoo conversion's notes: the map's first, then the conversion's, less the note on
    the generic rules (the map names every tensor of the checked file: they renamed none);
    without ``zoo``, ``notes`` as they are."""
    if not zoo:
        return notes
    return [*zoo, *(n for n in notes if not n.startswith("not a built-in model: generic"))]


def plan_zoo(
    source: PathLike, to: str, zoo: ZooMap | ZooTemplate
) -> tuple[ZooMap, int, dict[str, Any]]:
    """(the map, the file's class count, the map that converts it), after checking the
    file and the direction (a template is expanded for the file first); a one-line
    PolytrainError otherwise."""
    fmt, tensors = native_io.read_native(source)
    shapes = {name: tuple(np.shape(value)) for name, value in tensors.items()}
    what = f"{source} ({native_io.get_format(fmt).label})"
    if isinstance(zoo, ZooTemplate):
        if fmt != zoo.framework:
            raise CheckpointError(
                f"{what} is no file of {zoo.key} (a {zoo.framework} file): its template "
                f"converts {zoo.label}'s files into {zoo.twin}'s names only."
            )
        zmap = zoo.expand(shapes, what)
        _check_target(to, zmap, fmt)
        return zmap, 0, zmap.name_map(file_classes(zmap, shapes, what, native=True))
    if fmt == zoo.framework:
        _check_target(to, zoo, fmt)
        classes = file_classes(zoo, shapes, what, native=True)
    elif _canonical(fmt):
        if to != zoo.framework:
            raise ConfigError(
                f"--zoo {zoo.key} converts {what} into its zoo model's format: give "
                f"--to {zoo.framework}."
            )
        for prefix in native_io.get_format(fmt).layout.strip_prefixes:
            if shapes and all(k.startswith(prefix) for k in shapes):
                shapes = {k.removeprefix(prefix): v for k, v in shapes.items()}
        classes = file_classes(zoo, shapes, what, native=False)
    else:
        raise CheckpointError(
            f"{what} is no file of {zoo.key} (a {zoo.framework} file) nor a "
            f"torchvision state dict: pick the zoo map of its own framework."
        )
    return zoo, classes, zoo.name_map(classes)


def _check_target(to: str, zmap: ZooMap, fmt: str) -> None:
    if to != NEUTRAL and not _canonical(to):
        raise ConfigError(
            f"--zoo {zmap.key} maps its {fmt} file to {zmap.target} names: give --to torch "
            f"(or neutral), not {to}."
        )


def _canonical(fmt: str) -> bool:
    return fmt in native_io.formats() and native_io.get_format(fmt).layout.canonical


def zoo_notes(zmap: ZooMap, classes: int) -> list[str]:
    """What the conversion took from the zoo map, for the report."""
    if zmap.notes:
        return list(zmap.notes)
    verified = zmap.verified
    gap = verified.get("convert_logit_relative")
    how = f", logits within {gap:.1e} of the largest" if isinstance(gap, float) else ""
    notes = [
        f"zoo map {zmap.key}: {zmap.source} -> {zmap.twin} "
        f"({len(zmap.ported())} tensors; verified when generated{how})"
    ]
    if classes != zmap.classes:
        built = zmap.twin.replace("weights=None", f"weights=None, num_classes={classes}")
        notes.append(f"{classes} classes (the zoo's {zmap.classes}): build {built}; the "
                     f"classifier is {name_list(list(zmap.head))}")  # fmt: skip
    return notes
