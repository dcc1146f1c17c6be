"""Per-layer outputs for inspection and NaN diagnosis (forward hooks; a hybridized
model is run imperatively for this one pass, since hooks do not fire inside a graph)."""

from __future__ import annotations

from typing import Any

import numpy as np

from polytrain.backend.base import Backend, Model
from polytrain.backend.capture import ForwardHooks

from ._layers import hybridize


def _host(output: Any) -> np.ndarray:
    return output.astype("float32").asnumpy().copy()


HOOKS = ForwardHooks(
    children=lambda b: b._children.items(),
    attach=lambda b, hook: b.register_forward_hook(hook).detach,
    to_numpy=_host,
)


def layer_outputs(backend: Backend, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    block = model.replicas[0]
    layers = HOOKS.layers(model)
    hybridized = any(getattr(b, "_active", False) for b in [block, *(b for _, b in layers)])
    if hybridized:
        block.hybridize(False)
    try:
        return HOOKS.layer_outputs(model, lambda: backend.forward(model, x), layers)
    finally:
        if hybridized:
            hybridize(block)
