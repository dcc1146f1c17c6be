"""Named NLP models without the model objects: ``polytrain convert model_state.pdparams
bert.pt --to torch --zoo paddlenlp:bert`` (also ``paddlenlp:ernie``, ``gluonnlp:bert``).

A BERT's names and shapes depend on its size, so polytrain ships one template per family
(``zoo_maps/templates.json`` lists them) instead of one map per model: the per-layer
tensors carry the placeholder ``{i}``, the shapes are symbols (``V`` vocabulary, ``H``
hidden, ``I`` intermediate, ``P`` positions, ``T`` token types, ...), each read from one
axis of one named tensor of the file, and the layer count ``L`` is one past the largest
layer index found. The template expands into the zoo map of that file, which is then
checked against the file (names and shapes) as every zoo map is. The templates are the
maps ``polytrain port`` derives for PaddleNLP's and GluonNLP's models
(tests/porting/test_port_bert.py, tests/porting/test_port_gluon_bert.py), generalised
over the layer.

A file may hold the model under its base prefix (``bert.``, from a task model); tensors
outside the model (a pretraining or task head) are named in the mismatch, never dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polytrain.errors import CheckpointError, ConfigError
from polytrain.io.zoo_map import ZooMap, ZooTensor

TEMPLATES = "templates.json"  # {"zoos": {prefix: {...}}, "templates": {key: {"file"}}}
PLACEHOLDER = "{i}"
LAYERS = "L"  # the symbol of the layer count


@dataclass(frozen=True)
class TemplateRow:
    """One tensor of the target's state dict (per layer where ``name`` has ``{i}``)."""

    name: str
    shape: tuple[str | int, ...]
    native: str
    transposed: bool = False
    optional: bool = False  # filled only where the file has it (ERNIE 3.0's task types)

    @property
    def per_layer(self) -> bool:
        return PLACEHOLDER in self.name


@dataclass(frozen=True)
class ZooTemplate:
    """A shipped template: the model family ``key`` (``paddlenlp:bert``) into ``twin``."""

    key: str
    framework: str
    label: str
    source: str
    twin: str
    config_class: str
    dims: Mapping[str, tuple[str, int]]  # symbol -> (native tensor, axis)
    config: tuple[tuple[Any, ...], ...]  # (field, symbol) or (field, value, needed symbol)
    not_in_file: Mapping[str, str]  # config fields the file cannot give -> the hint
    rows: tuple[TemplateRow, ...]

    def expand(self, shapes: Mapping[str, tuple[int, ...]], what: str) -> ZooMap:
        """The zoo map of the file whose tensors have ``shapes`` (its names, unchecked)."""
        prefix = self._prefix(shapes)
        layers = self._layers(shapes, prefix)
        dims = self._dims(shapes, prefix) | {LAYERS: layers}
        tensors = tuple(self._tensors(shapes, prefix, dims, layers, what))
        notes = (
            f"zoo template {self.key}: {self.source} -> {self.twin} ({layers} layers, "
            f"{len(tensors)} tensors{f', under {prefix!r}' if prefix else ''})",
            self.config_note(dims),
        )
        return ZooMap(self.key, self.framework, self.label, self.source, self.twin, 0, (),
                      tensors, target="transformers", notes=notes)  # fmt: skip

    def config_note(self, dims: Mapping[str, int]) -> str:
        """What to set in the twin's config: the values the file gives, and those it cannot."""
        symbols = {*self.dims, LAYERS}
        given = []
        for field, value, *needs in self.config:
            if isinstance(value, str) and value in symbols:
                if value in dims:
                    given.append(f"{field}={dims[value]}")
            elif all(symbol in dims for symbol in needs):
                given.append(f"{field}={value!r}")
        given += [f"{field}=?" for field in self.not_in_file]
        hints = "; ".join(f"{field}: {hint}" for field, hint in self.not_in_file.items())
        return (f"build {self.twin}({self.config_class}({', '.join(given)})): the file "
                f"cannot give {' and '.join(self.not_in_file)} ({hints})")  # fmt: skip

    def _prefix(self, shapes: Mapping[str, tuple[int, ...]]) -> str:
        """The base prefix the file holds the model under (``bert.``), else ``""``."""
        first = next(iter(self.dims.values()))[0]
        if first in shapes:
            return ""
        found = [name for name in shapes if name.endswith("." + first)]
        return found[0][: -len(first)] if len(found) == 1 else ""

    def _layers(self, shapes: Mapping[str, tuple[int, ...]], prefix: str) -> int:
        """One past the largest layer index of the file's per-layer tensors."""
        patterns = [
            re.compile(re.escape(prefix + row.native).replace(re.escape(PLACEHOLDER), r"(\d+)"))
            for row in self.rows
            if row.per_layer
        ]
        found = [int(m.group(1)) for p in patterns for n in shapes if (m := p.fullmatch(n))]
        return max(found) + 1 if found else 0

    def _dims(self, shapes: Mapping[str, tuple[int, ...]], prefix: str) -> dict[str, int]:
        dims = {}
        for symbol, (tensor, axis) in self.dims.items():
            shape = shapes.get(prefix + tensor.replace(PLACEHOLDER, "0"), ())
            if axis < len(shape):
                dims[symbol] = shape[axis]
        return dims

    def _tensors(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        prefix: str,
        dims: Mapping[str, int],
        layers: int,
        what: str,
    ) -> Iterator[ZooTensor]:
        """The rows in order, the per-layer block once for each layer."""
        block = [row for row in self.rows if row.per_layer]
        start = self.rows.index(block[0]) if block else len(self.rows)
        order = [(row, 0) for row in self.rows[:start]]
        order += [(row, i) for i in range(layers) for row in block]
        order += [(row, 0) for row in self.rows[start + len(block) :]]
        for row, i in order:
            native = prefix + row.native.replace(PLACEHOLDER, str(i))
            if row.optional and native not in shapes:
                continue
            unknown = [s for s in row.shape if isinstance(s, str) and s not in dims]
            if unknown:
                tensor = prefix + self.dims[str(unknown[0])][0].replace(PLACEHOLDER, "0")
                raise CheckpointError(
                    f"{what} does not hold {self.label} {self.key.partition(':')[2]} as the "
                    f"zoo template {self.key} has it: it has no {tensor}. A model of your "
                    "own: derive its map with polytrain port (docs/porting.md)."
                )
            shape = tuple(dims[s] if isinstance(s, str) else s for s in row.shape)
            name = row.name.replace(PLACEHOLDER, str(i))
            yield ZooTensor(name, shape, native, row.transposed)


def template_index(folder: Path) -> dict[str, Any]:
    """``templates.json`` of ``folder`` (empty where there is none)."""
    path = folder / TEMPLATES
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"The zoo templates' index {path} cannot be read: {exc}.") from None
    return data if isinstance(data, dict) else {}


def read_template(path: Path, key: str, framework: str, label: str) -> ZooTemplate:
    """The template of ``key`` in ``path``; a ConfigError where it cannot be read."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = tuple(_row(row) for row in data["tensors"])
        dims = {str(s): (str(t), int(a)) for s, (t, a) in data["dims"].items()}
        config = tuple(tuple(entry) for entry in data["config"])
        _check_block(rows)
        return ZooTemplate(
            key,
            framework,
            label,
            data["source"],
            data["twin"],
            data["config_class"],
            dims,
            config,
            data["not_in_file"],
            rows,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"The zoo template {path} cannot be read: {exc}.") from None


def _row(row: list[Any]) -> TemplateRow:
    """``[name, shape, native, *flags]``, the flags ``transposed`` and ``optional``."""
    name, shape, native, *flags = row
    unknown = set(flags) - {"transposed", "optional"}
    if unknown:
        raise ValueError(f"unknown flags {sorted(unknown)} of {name}")
    shape = tuple(s if isinstance(s, str) else int(s) for s in shape)
    return TemplateRow(str(name), shape, str(native), "transposed" in flags, "optional" in flags)


def _check_block(rows: tuple[TemplateRow, ...]) -> None:
    """The per-layer rows are one run, each with ``{i}`` in both names."""
    marks = "".join("L" if row.per_layer else "-" for row in rows)
    if re.fullmatch(r"-*L*-*", marks) is None:
        raise ValueError("the per-layer rows ({i}) are not one run")
    if any(row.per_layer != (PLACEHOLDER in row.native) for row in rows):
        raise ValueError("a row has {i} in one of its names only")
