"""Per-layer outputs for inspection and NaN diagnosis (forward post-hooks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from polytrain.backend.base import Model


def _inspected(layer: paddle.nn.Layer) -> list[tuple[str, paddle.nn.Layer]]:
    """Leaf layers, plus residual blocks (whose sum and ReLU live in their forward)."""
    return [
        (name, sub)
        for name, sub in layer.named_sublayers()
        if not list(sub.children()) or type(sub).__name__ == "_Residual"
    ]


def layer_outputs(backend: Any, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    captured: list[tuple[str, np.ndarray]] = []

    def hook(name: str) -> Any:
        def record(_layer: Any, _inputs: Any, output: Any) -> None:
            captured.append((name, output.detach().astype("float32").numpy().copy()))

        return record

    handles = [s.register_forward_post_hook(hook(n)) for n, s in _inspected(model.replicas[0])]
    try:
        backend.forward(model, x)
    finally:
        for h in handles:
            h.remove()
    return captured
