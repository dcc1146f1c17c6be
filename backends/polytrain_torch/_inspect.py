"""Per-layer outputs for inspection and NaN diagnosis (forward hooks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from polytrain.backend.base import Model


def _inspected(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Leaf layers, plus residual blocks (whose sum and ReLU live in their forward)."""
    return [
        (name, m)
        for name, m in module.named_modules()
        if name and (not any(True for _ in m.children()) or type(m).__name__ == "_Residual")
    ]


def layer_outputs(backend: Any, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    captured: list[tuple[str, np.ndarray]] = []

    def hook(name: str) -> Any:
        def record(_module: Any, _inputs: Any, output: Any) -> None:
            captured.append((name, output.detach().float().cpu().numpy().copy()))

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in _inspected(model.replicas[0])]
    try:
        backend.forward(model, x)
    finally:
        for h in handles:
            h.remove()
    return captured
