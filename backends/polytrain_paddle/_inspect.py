"""Per-layer outputs for inspection and NaN diagnosis (forward post-hooks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from polytrain.backend.base import Backend, Model
from polytrain.backend.capture import ForwardHooks


def _host(output: paddle.Tensor) -> np.ndarray:
    return output.detach().astype("float32").numpy().copy()


HOOKS = ForwardHooks(
    children=lambda layer: layer.named_children(),
    attach=lambda layer, hook: layer.register_forward_post_hook(hook).remove,
    to_numpy=_host,
)


def layer_outputs(backend: Backend, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    return HOOKS.layer_outputs(model, lambda: backend.forward(model, x))
