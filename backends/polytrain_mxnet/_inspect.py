"""Per-layer outputs for inspection and NaN diagnosis (forward hooks; a hybridized
model is run imperatively for this one pass, since hooks do not fire inside a graph)."""

from __future__ import annotations

from typing import Any

import numpy as np

from polytrain.backend.base import Backend, Model
from polytrain.backend.capture import capture_outputs, inspected_layers, spec_paths

from ._layers import hybridize


def _host(output: Any) -> np.ndarray:
    return output.astype("float32").asnumpy().copy()


def paths(model: Model) -> set[str] | None:
    """The spec's reported paths (None: a model built without a spec)."""
    return None if model.spec is None else spec_paths(model.spec)


def layer_outputs(backend: Backend, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    block = model.replicas[0]
    layers = inspected_layers(block, lambda b: b._children.items(), paths(model))
    hybridized = any(getattr(b, "_active", False) for b in [block, *(b for _, b in layers)])
    if hybridized:
        block.hybridize(False)
    try:
        return capture_outputs(
            layers,
            lambda b, hook: b.register_forward_hook(hook).detach,
            _host,
            lambda: backend.forward(model, x),
        )
    finally:
        if hybridized:
            hybridize(block)
