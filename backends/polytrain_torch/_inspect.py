"""Per-layer outputs for inspection and NaN diagnosis (forward hooks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from polytrain.backend.base import Backend, Model
from polytrain.backend.capture import capture_outputs, inspected_layers, spec_paths


def _host(output: torch.Tensor) -> np.ndarray:
    return output.detach().float().cpu().numpy().copy()


def paths(model: Model) -> set[str] | None:
    """The spec's reported paths (None: a model built without a spec)."""
    return None if model.spec is None else spec_paths(model.spec)


def layer_outputs(backend: Backend, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    return capture_outputs(
        inspected_layers(model.replicas[0], lambda m: m.named_children(), paths(model)),
        lambda m, hook: m.register_forward_hook(hook).remove,
        _host,
        lambda: backend.forward(model, x),
    )
