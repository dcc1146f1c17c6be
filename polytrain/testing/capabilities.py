"""Optional capabilities of a backend, as the backend itself declares them, so the
conformance suite skips (with the reason) what a backend does not claim instead of failing.

* ``fp64``: :meth:`Backend.precision_support` says float64 works on the CPU.
* ``layer_outputs``: the backend implements the optional verb
  :meth:`Backend.layer_outputs` (the base class only refuses).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from polytrain.backend.base import Backend
from polytrain.backend.model import ModelVerbs


@dataclass(frozen=True)
class Capability:
    """One optional capability: its name and how to read the backend's declaration
    (``why_not`` returns None when declared, else the reason)."""

    name: str
    why_not: Callable[[Backend], str | None]


def _fp64_why_not(backend: Backend) -> str | None:
    support = backend.precision_support(backend.device("cpu")).get("fp64")
    if support is not None and support.supported:
        return None
    detail = support.detail if support is not None else "precision_support lists no fp64"
    return f"no float64 on the CPU ({detail})"


def _layer_outputs_why_not(backend: Backend) -> str | None:
    if type(backend).layer_outputs is ModelVerbs.layer_outputs:
        return "the optional verb Backend.layer_outputs is not implemented"
    return None


FP64 = Capability("fp64", _fp64_why_not)
LAYER_OUTPUTS = Capability("layer_outputs", _layer_outputs_why_not)


def require(backend: Backend, capability: Capability) -> None:
    """Skip the calling test, naming the reason, unless ``backend`` declares ``capability``."""
    reason = capability.why_not(backend)
    if reason is not None:
        pytest.skip(f"backend {backend.name!r} does not declare {capability.name}: {reason}")
