"""Per-layer outputs for inspection and NaN diagnosis (forward hooks; a hybridized
model is run imperatively for this one pass, since hooks do not fire inside a graph)."""

from __future__ import annotations

from typing import Any

import numpy as np
from mxnet.gluon import Block

from polytrain.backend.base import Model

from ._layers import hybridize


def _inspected(block: Block, prefix: str = "") -> list[tuple[str, Block]]:
    """Leaf blocks, plus residual blocks (whose sum and ReLU live in their forward)."""
    found = []
    for name, child in block._children.items():
        path = f"{prefix}.{name}" if prefix else name
        if not child._children or type(child).__name__ == "_Residual":
            found.append((path, child))
        found.extend(_inspected(child, path))
    return found


def layer_outputs(backend: Any, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    captured: list[tuple[str, np.ndarray]] = []
    block = model.replicas[0]

    def hook(name: str) -> Any:
        def record(_block: Any, _inputs: Any, output: Any) -> None:
            captured.append((name, output.astype("float32").asnumpy().copy()))

        return record

    hybridized = any(getattr(b, "_active", False) for _, b in [("", block), *_inspected(block)])
    if hybridized:
        block.hybridize(False)
    handles = [b.register_forward_hook(hook(n)) for n, b in _inspected(block)]
    try:
        backend.forward(model, x)
    finally:
        for h in handles:
            h.detach()
        if hybridized:
            hybridize(block)
    return captured
