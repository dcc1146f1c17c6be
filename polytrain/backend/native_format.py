"""A framework's native weights file, as its plugin declares it.

A backend plugin registers one :class:`NativeFormat` per file format through the
``polytrain_register_formats`` hook; :mod:`polytrain.io.native` detects, reads and writes
files through the registered formats only, and :mod:`polytrain.io.convert` maps names
and layouts with each format's :class:`LayoutRules`. A format must not import its
framework to be declared (reading and writing are pure numpy where the format allows).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class LayoutRules:
    """How a framework names and lays out the canonical (PyTorch) tensors of each layer
    kind (the class names of :mod:`polytrain.neutral.models`: ``Linear``, ``BatchNorm2d``)."""

    renames: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """layer kind -> {canonical leaf: native leaf}, e.g. BatchNorm2d running_mean -> _mean."""
    transposed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """layer kind -> leaves stored transposed, e.g. Linear weight stored [in, out]."""
    constants: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    """layer kind -> native-only leaves written as they are (and ignored when read)."""
    strip_prefixes: tuple[str, ...] = ()
    """prefixes removed from every name when all names carry one (``module.`` of DDP)."""


class NativeFormat(ABC):
    """One native weights format: recognised by content, read and written with numpy."""

    name: str
    """the framework's name, as ``polytrain convert --to`` takes it"""
    label: str
    """for messages, e.g. ``Paddle .pdparams``"""
    suffix: str
    """the usual file suffix, e.g. ``.pdparams`` (never used to recognise a file)"""
    layout: LayoutRules = LayoutRules()
    order: int = 100
    """detection and listing order (the lowest first)"""

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
        """The file's bytes for these native tensors (names and layout already native)."""
