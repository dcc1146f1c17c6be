"""Native files: a model's weights in the framework's own format, written and read by the
framework (the format itself is declared by the plugin: :mod:`polytrain.backend.native_format`).
A capability (:mod:`polytrain.backend.discovery`)."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from polytrain.backend.discovery import Capability
from polytrain.backend.model import Model


class NativeIO(Capability):
    """Saving and loading the framework's own weight files."""

    label: ClassVar[str] = "native weight files"
    marks: ClassVar[tuple[str, ...]] = ("save_native", "load_native")

    native_suffix: ClassVar[str]

    @abstractmethod
    def save_native(self, model: Model, path: str) -> None:
        """Write the framework's own format (.pt / .pdparams / .params), host memory,
        no wrapper prefixes, atomically."""

    @abstractmethod
    def load_native(self, model: Model, path: str) -> None:
        """Read the framework's own format written by :meth:`save_native` or by plain
        framework code (torch loads with ``weights_only=True``)."""
