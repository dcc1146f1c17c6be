"""The naming and layout rule of one native format, used both ways: a canonical name to
the native one (a leaf renamed for its layer kind) when writing, the native name back to
the canonical one when reading, and whether a tensor is stored transposed. The rule is
table-driven: the plugin's :class:`~polytrain.backend.native_format.LayoutRules` (renames
and transposed leaves per layer kind) is the table.

Also here: the map of a built-in model (the rule over its spec), the entries a user's map
names exactly, and the small helpers the reading and writing sides share.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytrain.backend.mismatch import name_list
from polytrain.backend.native_format import LayoutRules, NativeFormat, TensorRole
from polytrain.errors import ConfigError
from polytrain.io import native as native_io
from polytrain.io.name_map import MapEntry, NameMap, UserEntry
from polytrain.io.native import NEUTRAL
from polytrain.neutral.models import ModelSpec, layer_parameters
from polytrain.neutral.spec_file import resolve_model_spec

PathLike = str | os.PathLike[str]
DTYPES = ("float32", "float64")  # of the float tensors a conversion writes
LIST_MAX = 6  # names listed in a message


@dataclass(frozen=True)
class NameRule:
    """How one format names and lays out canonical tensors, both ways (its ``layout``
    table)."""

    layout: LayoutRules

    @classmethod
    def of(cls, fmt: str) -> NameRule:
        return cls(native_io.get_format(fmt).layout)

    @property
    def transposing(self) -> bool:
        """The format stores some layer kind's weights transposed."""
        return any(self.layout.transposed.values())

    def native_name(self, canonical: str, kind: str | None) -> str:
        """Canonical -> native: the leaf as the format names it for a layer of ``kind``
        (no kind: the name as it is)."""
        if kind is None:
            return canonical
        head, leaf = self.split(canonical, kind)
        native = self.layout.native_leaf(kind, leaf)
        return f"{head}.{native}" if head else native

    def canonical_name(self, native: str, role: TensorRole | None = None) -> str:
        """Native -> canonical: the leaf from the tensor's role where a companion file
        gives one (``linear_0.w_0`` fed to a matmul -> ``linear_0.weight``), else the
        format's leaf renames undone (whatever the kind: the file does not say it)."""
        if role is not None and role.native_leaf is not None:
            for sep in (".", "_"):
                if native.endswith(sep + role.native_leaf):
                    return f"{native[: -len(role.native_leaf) - 1]}.{role.leaf}"
        renames = self.layout.canonical_leaves()
        head, _, leaf = native.rpartition(".")
        return f"{head}.{renames.get(leaf, leaf)}" if head else renames.get(leaf, leaf)

    def transpose(self, kind: str | None, name: str, ndim: int) -> bool | None:
        """Whether a tensor is stored transposed: by its layer kind where known; a 2-D
        tensor of unknown kind is undecided (None) in a format that transposes some kind."""
        if kind is not None:
            return self.layout.is_transposed(kind, self.split(name, kind)[1])
        return None if self.transposing and ndim == 2 else False

    def split(self, name: str, kind: str) -> tuple[str, str]:
        """``name`` as its layer's path and its leaf: the longest leaf the table names for
        ``kind`` that ends ``name`` (``attn.out_proj.weight`` -> ``attn``,
        ``out_proj.weight``), else the last part."""
        leaves = {*self.layout.renames.get(kind, {}), *self.layout.transposed.get(kind, ())}
        for leaf in sorted(leaves, key=len, reverse=True):
            if name == leaf or name.endswith("." + leaf):
                return name[: -len(leaf) - 1], leaf
        head, _, leaf = name.rpartition(".")
        return head, leaf

    def exact_entry(self, name: str, given: UserEntry) -> MapEntry:
        """The entry of a map's exact entry for ``name`` read as it is (a packed one: its
        layout from ``transpose``, or from ``kind`` for its parts' leaf)."""
        if not given.parts:
            return MapEntry(
                self.exact_native(name, given), False, given.shape, reshape=given.reshape
            )
        transpose = given.transpose
        if transpose is None and given.kind is not None:
            transpose = self.transpose(given.kind, given.parts[0], 0)
        return MapEntry(given.parts[0], transpose, given.shape, given.kind, given.parts)

    def exact_native(self, name: str, given: UserEntry) -> str:
        """The native name of a map's exact entry: as given, else the canonical one with
        the format's leaf name for the entry's kind."""
        return given.native if given.native is not None else self.native_name(name, given.kind)


def builtin_map(spec: ModelSpec, framework: str) -> NameMap:
    """The map of a neutral spec for the format ``framework``, as its plugin's
    :class:`~polytrain.backend.native_format.LayoutRules` name and lay out the tensors."""
    rule = NameRule.of(framework)
    entries: dict[str, MapEntry] = {}
    constants: dict[str, np.ndarray] = {}
    for path, layer in spec.layers():
        kind = type(layer).__name__
        for leaf, shape in layer_parameters(layer).items():
            name = f"{path}.{leaf}"
            native = rule.native_name(name, kind)
            entries[name] = MapEntry(native, rule.transpose(kind, name, len(shape)), shape, kind)
        for leaf, value in rule.layout.constants.get(kind, {}).items():
            constants[f"{path}.{leaf}"] = value
    ignore = rule.layout.ignored_suffixes
    return NameMap(framework, entries, constants, ignore, source=f"model {spec.name!r}")


def model_spec(model: str | ModelSpec | None) -> ModelSpec | None:
    """A built-in name, ``pkg.module:factory`` or a spec file as its spec."""
    if model is None or isinstance(model, ModelSpec):
        return model
    return resolve_model_spec(model)


def targets() -> tuple[str, ...]:
    """What ``--to`` takes: the registered formats' names, then neutral."""
    return (*native_io.formats(), NEUTRAL)


def check_target(to: str) -> None:
    if to not in targets():
        raise ConfigError(f"Unknown target {to!r}; use one of {', '.join(targets())}.")


def transposed_kinds(fmt: NativeFormat) -> str:
    """The layer kinds whose weights ``fmt`` stores transposed, for messages."""
    return "/".join(kind for kind, leaves in fmt.layout.transposed.items() if leaves)


def float_dtype(params: Mapping[str, Any]) -> str:
    """float64 if any float tensor is float64 (an fp64 run), else float32."""
    wide = any(np.asarray(a).dtype == np.float64 for a in params.values())
    return "float64" if wide else "float32"


def as_floats(params: Mapping[str, Any], dtype: str) -> dict[str, np.ndarray]:
    """Float tensors in ``dtype`` (float32 is the canonical one), others as they are."""
    out = {}
    for name, value in params.items():
        arr = np.asarray(value)
        out[name] = arr.astype(dtype, copy=False) if arr.dtype.kind == "f" else arr
    return out


def shape_of(tensors: Mapping[str, np.ndarray], name: str) -> tuple[int, ...]:
    return tuple(np.shape(tensors[name])) if name in tensors else ()


def listed(items: list[str]) -> str:
    """Names for a message (the first few, then how many more)."""
    return name_list(items, LIST_MAX)
