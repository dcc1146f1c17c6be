"""Per-layer outputs for inspection and NaN diagnosis (forward hooks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from polytrain.backend.base import Backend, Model
from polytrain.backend.capture import ForwardHooks


def _host(output: torch.Tensor) -> np.ndarray:
    return output.detach().float().cpu().numpy().copy()


HOOKS = ForwardHooks(
    children=lambda m: m.named_children(),
    attach=lambda m, hook: m.register_forward_hook(hook).remove,
    to_numpy=_host,
)


def layer_outputs(backend: Backend, model: Model, x: Any) -> list[tuple[str, np.ndarray]]:
    return HOOKS.layer_outputs(model, lambda: backend.forward(model, x))
