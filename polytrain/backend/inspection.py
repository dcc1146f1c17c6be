"""Per-layer outputs of a model: a capability (:mod:`polytrain.backend.discovery`) for
``--inspect`` and for naming the first layer whose output went non-finite."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import numpy as np

from polytrain.backend.devices import Tensor
from polytrain.backend.discovery import Capability
from polytrain.backend.model import Model


class Inspection(Capability):
    """A model's layer-by-layer outputs (:mod:`polytrain.backend.capture` helps)."""

    label: ClassVar[str] = "per-layer outputs"
    marks: ClassVar[tuple[str, ...]] = ("layer_outputs",)

    @abstractmethod
    def layer_outputs(self, model: Model, x: Tensor) -> list[tuple[str, np.ndarray]]:
        """Eval-mode forward of replica 0 returning every leaf layer's output (and each
        residual block's), in forward order, as numpy: for inspection and for naming the
        first layer whose output went non-finite."""
