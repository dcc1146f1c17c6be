"""A framework's native weights file, as its plugin declares it.

A backend plugin registers one :class:`NativeFormat` per file format through the
``polytrain_register_formats`` hook; :mod:`polytrain.io.native` detects, reads and writes
files through the registered formats only, and :mod:`polytrain.io.convert` maps names
and layouts with each format's :class:`LayoutRules`. A format must not import its
framework to be declared (reading and writing are pure numpy where the format allows).
"""

from __future__ import annotations

import os
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polytrain.backend.optimizer_file import OptimizerFile
from polytrain.errors import CheckpointError
from polytrain.utils.fileio import atomic_write_bytes

PathLike = str | os.PathLike[str]


# Layer kinds whose canonical (PyTorch) layout every format is described against; a kind
# no format transposes or renames is stored as it is (Embedding [num, dim], LSTM/GRU/RNN
# weight_ih [gates * hidden, in] with the gates in PyTorch's order, ...).
LAYER_KINDS = (
    "Linear", "Conv1d", "Conv2d", "Conv3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "LayerNorm", "Embedding", "LSTM", "GRU", "RNN",
)  # fmt: skip


@dataclass(frozen=True)
class LayoutRules:
    """How a format names and lays out the canonical (PyTorch) tensors of each layer kind
    (the class names of :mod:`polytrain.neutral.models`: ``Linear``, ``BatchNorm2d``).
    No renames and nothing transposed: the format is canonical."""

    renames: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """layer kind -> {canonical leaf: native leaf}, e.g. BatchNorm2d running_mean -> _mean."""
    transposed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """layer kind -> leaves stored transposed, e.g. Linear weight stored [in, out]."""
    constants: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    """layer kind -> native-only leaves written as they are (and ignored when read)."""
    strip_prefixes: tuple[str, ...] = ()
    """prefixes removed from every name when all names carry one (``module.`` of DDP)."""
    note: str = "canonical layout"
    """how messages describe this layout, e.g. ``Paddle layout, Linear [in, out]``"""
    attention: tuple[str, ...] = ()
    """the child names of the query, key, value and output Linears of the framework's
    attention layer where it keeps them apart (Paddle's ``q_proj``, ``k_proj``, ``v_proj``,
    ``out_proj``), which PyTorch's ``nn.MultiheadAttention`` packs (``in_proj_weight``);
    empty: attention tensors are stored as PyTorch's"""

    @property
    def canonical(self) -> bool:
        """Names and layout are the canonical ones (constants aside)."""
        return not any(self.renames.values()) and not any(self.transposed.values())

    @property
    def ignored_suffixes(self) -> tuple[str, ...]:
        """Name endings skipped when reading: the constants' leaves (``.num_batches_tracked``)."""
        return tuple(sorted({f".{leaf}" for leaves in self.constants.values() for leaf in leaves}))

    def native_leaf(self, kind: str, leaf: str) -> str:
        return self.renames.get(kind, {}).get(leaf, leaf)

    def is_transposed(self, kind: str, leaf: str) -> bool:
        return leaf in self.transposed.get(kind, frozenset())

    def canonical_leaves(self) -> dict[str, str]:
        """native leaf -> canonical leaf over every layer kind, for files of unknown models."""
        return {native: leaf for names in self.renames.values() for leaf, native in names.items()}


@dataclass(frozen=True)
class TensorRole:
    """What a file beside the weights (a program, a symbol graph) says one tensor is: the
    input of an op it feeds. ``kind`` None: the ops disagree or say nothing about the
    layout (the tensor then needs the map if it is 2-D)."""

    kind: str | None  # the layer kind (``Linear``, ``Conv2d``, ``BatchNorm2d``, ...)
    leaf: str  # its canonical leaf: ``weight``, ``bias``, ``running_mean``, ``running_var``
    native_leaf: str | None = None  # the end of its native name that names it (``w_1``)


@dataclass(frozen=True)
class CompanionRoles:
    """The roles of a weights file's tensors, from the file beside it that ``source``
    names; ``notes`` say what was read and what it could not establish."""

    source: str
    roles: Mapping[str, TensorRole] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


class NativeFormat(ABC):
    """One native weights format: recognised by content, read and written with numpy."""

    name: str
    """the framework's name, as ``polytrain convert --to`` takes it"""
    label: str
    """for messages, e.g. ``Paddle .pdparams``"""
    suffix: str
    """the usual file suffix, e.g. ``.pdparams`` (never used to recognise a file)"""
    signature: str = ""
    """how its files start, for messages, e.g. ``80 ..``"""
    layout: LayoutRules = LayoutRules()
    order: int = 100
    """detection and listing order (the lowest first)"""
    layer_evidence: str = "the file"
    """what :meth:`layer_kinds` reads, for messages, e.g. ``its name table``"""

    @abstractmethod
    def sniff(self, head: bytes, path: PathLike) -> bool:
        """Whether a file starting with ``head`` (its first 16 bytes) is in this format.
        May raise :class:`~polytrain.errors.CheckpointError` for a variant it recognises
        but cannot read, saying how to resolve it."""

    @abstractmethod
    def read(self, path: PathLike) -> dict[str, np.ndarray]:
        """``{native name: array}``; a truncated, corrupt or foreign file is a
        :class:`~polytrain.errors.CheckpointError`. Never runs code from the file."""

    @abstractmethod
    def encode(self, tensors: Mapping[str, np.ndarray]) -> bytes:
        """The file's bytes for these native tensors (names and layout already native).
        May import the framework (an ImportError then says it is missing)."""

    def layer_kinds(self, path: PathLike) -> Mapping[str, str] | None:
        """native name -> layer kind, for a model that is none of the built-in ones, where
        the file itself establishes it (a name table the framework generated); a tensor
        left out has no evidence, and a 2-D one then needs the user's map. None when the
        file records nothing. Never from a tensor's name or shape alone."""
        return None

    def companion_roles(self, path: PathLike) -> CompanionRoles | None:
        """The role of each tensor (layer kind, canonical leaf) where a file the framework
        writes beside the weights establishes it (an exported program or symbol graph:
        the op each tensor feeds); None when there is no such file to read. Takes
        precedence over :meth:`layer_kinds`; never from a tensor's name or shape alone."""
        return None

    def read_optimizer(
        self, path: PathLike, weights: PathLike, settings: Mapping[str, Any]
    ) -> OptimizerFile:
        """The optimizer state in ``path``, a file of this framework written by the run
        whose weights are ``weights``; tensors named as in ``weights``, in its layout.
        ``settings`` are the user's (:func:`~polytrain.backend.optimizer_file.parse_settings`)."""
        raise CheckpointError(
            f"polytrain reads no optimizer state next to {self.label} weights "
            f"({os.fspath(path)}): it ports optimizer files of the formats whose plugins "
            "read them (see docs/porting.md, Optimizer state)."
        )

    def encode_optimizer(self, state: OptimizerFile) -> bytes:
        """The bytes of this framework's optimizer file for ``state`` (canonical names
        and layout, parameters in the model's order). May import the framework."""
        raise CheckpointError(
            f"polytrain writes no optimizer file for {self.label}; write the optimizer "
            "state to PyTorch (--to torch) or a neutral checkpoint (--to neutral)."
        )

    def encode_scheduler(self, state: OptimizerFile) -> bytes:
        """The bytes of this framework's learning-rate scheduler file for
        ``state.scheduler``. May import the framework."""
        raise CheckpointError(
            f"polytrain writes no scheduler file for {self.label}; write the optimizer "
            "state and its schedule to PyTorch (--to torch)."
        )

    def write(self, path: PathLike, tensors: Mapping[str, np.ndarray]) -> None:
        """Write ``tensors`` (native names and layout) to ``path``, atomically."""
        if Path(path).is_dir():
            raise CheckpointError(f"{path} is a directory: give a file name for a native file.")
        bad = [f"{k!r} ({np.asarray(v).dtype})" for k, v in tensors.items() if not _numeric(v)]
        if bad:
            raise CheckpointError(
                f"A {self.label} file holds numeric arrays only, not {', '.join(bad[:4])}."
            )
        atomic_write_bytes(path, self.encode(tensors))


def zip_entry_names(path: PathLike) -> list[str] | None:
    """The names inside a zip file (formats built on zip tell themselves apart by them);
    None for a damaged zip, which the format that reads it then describes."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except Exception:  # a damaged zip raises anything
        return None


def _numeric(value: object) -> bool:
    return isinstance(value, np.ndarray | np.generic) and value.dtype.kind in "fiucb"
