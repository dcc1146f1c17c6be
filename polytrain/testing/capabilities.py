"""Optional capabilities of a backend, as the backend itself declares them, so the
conformance suite skips (with the reason) what a backend does not claim instead of failing.

* ``fp64``: :meth:`Precision.precision_support` says float64 works on the CPU, and the
  plugin's :class:`~polytrain.backend.capabilities.Capabilities` list ``float64``.
* ``layer_outputs``, ``collectives``, ``native files``: the backend has the capability
  (:class:`~polytrain.backend.inspection.Inspection`,
  :class:`~polytrain.backend.collectives.Collectives`,
  :class:`~polytrain.backend.native_io.NativeIO`: :mod:`polytrain.backend.discovery`).
* ``in-place collectives``: the plugin declares ``in-place`` collectives (``allreduce``
  and ``broadcast`` change their tensors; a framework of immutable arrays declares only
  ``returned``: ``all_reduced``/``broadcasted``).
* ``emulated devices``: the plugin declares ``cpu:N``.
* layer types: :func:`require_layers`, every layer type of a spec declared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from polytrain.backend.base import Backend
from polytrain.backend.capabilities import Capabilities
from polytrain.backend.collectives import Collectives
from polytrain.backend.discovery import Capability as CapabilityABC
from polytrain.backend.inspection import Inspection
from polytrain.backend.native_io import NativeIO
from polytrain.backend.precision_verbs import precision_support
from polytrain.neutral.models import Layer
from polytrain.plugins.registry import registered_backends


@dataclass(frozen=True)
class Capability:
    """One optional capability: its name and how to read the backend's declaration
    (``why_not`` returns None when declared, else the reason)."""

    name: str
    why_not: Callable[[Backend], str | None]


def declared(backend: Backend) -> Capabilities:
    """The capabilities the backend's plugin declares (all, for an unregistered one)."""
    info = registered_backends().get(backend.name)
    return info.capabilities if info is not None else Capabilities()


def _fp64_why_not(backend: Backend) -> str | None:
    if "float64" not in declared(backend).dtypes:
        return "its plugin's capabilities list no float64 dtype"
    support = precision_support(backend, backend.device("cpu")).get("fp64")
    if support is not None and support.supported:
        return None
    detail = support.detail if support is not None else "precision_support lists no fp64"
    return f"no float64 on the CPU ({detail})"


def _has(kind: type[CapabilityABC], verbs: str) -> Callable[[Backend], str | None]:
    def why_not(backend: Backend) -> str | None:
        if kind.of(backend) is not None:
            return None
        return f"its class does not list {kind.__name__} ({verbs})"

    return why_not


def _declares(kind: str, value: str, what: str) -> Callable[[Backend], str | None]:
    def why_not(backend: Backend) -> str | None:
        values = getattr(declared(backend), kind)
        return None if value in values else f"its {kind} are {', '.join(values)}: {what}"

    return why_not


FP64 = Capability("fp64", _fp64_why_not)
LAYER_OUTPUTS = Capability("layer_outputs", _has(Inspection, "layer_outputs"))
COLLECTIVES = Capability("collectives", _has(Collectives, "allreduce, broadcast..."))
NATIVE_IO = Capability("native files", _has(NativeIO, "save_native, load_native"))
INPLACE_COLLECTIVES = Capability(
    "in-place collectives",
    _declares("collectives", "in-place", "allreduce/broadcast do not change their tensors"),
)
EMULATED_DEVICES = Capability(
    "emulated devices", _declares("devices", "cpu:N", "no cpu:N devices in one process")
)


def require(backend: Backend, capability: Capability) -> None:
    """Skip the calling test, naming the reason, unless ``backend`` declares ``capability``."""
    reason = capability.why_not(backend)
    if reason is not None:
        pytest.skip(f"backend {backend.name!r} does not declare {capability.name}: {reason}")


def require_layers(backend: Backend, layer: Layer) -> None:
    """Skip the calling test unless every layer type in ``layer`` is declared."""
    missing = declared(backend).missing_layers(layer)
    if missing:
        pytest.skip(f"backend {backend.name!r} does not declare layer types {', '.join(missing)}")
