"""Per-layer outputs for inspection and NaN diagnosis (forward post-hooks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from polytrain.backend.base import Backend, Model
from polytrain.backend.capture import capture_outputs, inspected_layers, spec_paths


def _host(output: paddle.Tensor) -> np.ndarray:
    return output.detach().astype("float32").numpy().copy()


def paths(model: Model) -> set[str] | None:
    """The spec's reported paths (None: a model built without a spec)."""
    return None if model.spec is None else spec_paths(model.spec)


def layer_outputs(backend: Backend, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    return capture_outputs(
        inspected_layers(model.replicas[0], lambda layer: layer.named_children(), paths(model)),
        lambda layer, hook: layer.register_forward_post_hook(hook).remove,
        _host,
        lambda: backend.forward(model, x),
    )
