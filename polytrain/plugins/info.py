"""What a plugin declares about what it provides, without importing its framework."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from polytrain.backend.capabilities import Capabilities

if TYPE_CHECKING:
    from polytrain.backend.base import Backend


@dataclass(frozen=True)
class BackendInfo:
    """What a plugin tells polytrain about one backend, without importing its framework."""

    name: str
    framework: str
    distribution: str
    factory: Callable[..., Backend]
    extra: str | None = None
    description: str = ""
    order: int = 100  # display order in compare/doctor/backends; the lowest is compare's reference
    collectives: str = ""  # how its processes talk, as `polytrain doctor` shows it
    auto_select: bool = True  # may be picked when no backend is named and it is the only one
    install: str | None = None  # the plugin's own install command, e.g. "pip install my-jax"
    #: what it supports (layer types, dtypes, devices, collectives); the default is all
    capabilities: Capabilities = field(default_factory=Capabilities)

    @property
    def install_hint(self) -> str:
        """How to get the framework: the plugin's ``install`` command, else polytrain's
        ``extra`` when the plugin names one, else the framework's distribution."""
        if self.install:
            return self.install
        if self.extra:
            return f"pip install 'polytrain[{self.extra}]'"
        return f"pip install '{self.distribution}'"

    def available(self) -> bool:
        """True if the framework can be found (not imported) in this environment."""
        try:
            return importlib.util.find_spec(self.framework) is not None
        except (ImportError, ValueError):
            return False

    def version(self) -> str | None:
        """Installed framework version from package metadata, or None."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
