"""A framework's model objects, walked and traced for ``polytrain port``.

A backend plugin registers one :class:`ModelWalker` through the
``polytrain_register_model_walkers`` hook. It lists a model's leaf layers that hold
tensors, in registration order, each with its kind (``Linear``, ``Conv2d``, ``BatchNorm``,
``Embedding``, ``LayerNorm`` or the class name) and its tensors by canonical role
(``weight``, ``bias``, ``running_mean``, ``running_var``) with the transpose that brings
each to the canonical (PyTorch) layout: the layer object is the evidence for the layout.
It also runs a model in eval mode with forward hooks on those layers. Everything crosses
the boundary as numpy; the framework is imported only inside the methods.

A walker never reads a file: a weights file a user gives (``port --weights``) is data,
read by polytrain's own reader of its format (:func:`polytrain.io.native.read_native`,
which never runs code from a file), and only its tensors reach :meth:`ModelWalker.load_saved`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("Linear", "Conv1d", "Conv2d", "Conv3d", "BatchNorm", "Embedding", "LayerNorm")


@dataclass(frozen=True)
class LayerTensor:
    """One tensor of a layer: its name in the model's state (the key its framework saves it
    under), its value as stored, and whether the canonical layout is its transpose."""

    native: str
    value: np.ndarray
    transpose: bool = False

    @property
    def canonical(self) -> np.ndarray:
        return np.ascontiguousarray(self.value.T if self.transpose else self.value)


@dataclass(frozen=True)
class WalkedLayer:
    """A leaf layer with tensors: its path in the model, kind, class name and tensors by role."""

    name: str
    kind: str
    type_name: str
    tensors: Mapping[str, LayerTensor] = field(default_factory=dict)
    groups: int = 1  # grouped (depthwise) convolutions: their group count

    def describe(self) -> str:
        shapes = ", ".join(
            f"{role} {list(t.canonical.shape)}" for role, t in sorted(self.tensors.items())
        )
        return f"{self.name} ({self.type_name}: {shapes})"


@dataclass
class Trace:
    """A model's output and each traced layer's first output, in call order."""

    output: np.ndarray
    layers: dict[str, np.ndarray]


class ModelWalker(ABC):
    """Walks and traces the model objects of one framework."""

    framework: str
    """the framework's name, which is also the name of its registered native format"""

    @abstractmethod
    def owns(self, model: Any) -> bool:
        """Whether ``model`` is a model object of this framework (without importing it
        when it is not imported yet: then the object cannot be one)."""

    @abstractmethod
    def layers(self, model: Any) -> list[WalkedLayer]:
        """The leaf layers holding tensors, in registration order."""

    @abstractmethod
    def state(self, model: Any) -> dict[str, np.ndarray]:
        """The model's whole state as its framework saves it (native names and layout)."""

    @abstractmethod
    def load_state(
        self, model: Any, tensors: Mapping[str, np.ndarray], what: str = "the ported state"
    ) -> None:
        """Load a whole state (native names and layout) into ``model``, strictly; a name
        mismatch is a CheckpointError about ``what``."""

    def load_saved(self, model: Any, tensors: Mapping[str, np.ndarray], source: str) -> None:
        """Load the tensors of a weights file its framework saved for this model, as
        polytrain's own reader read them from ``source`` (never the file itself), names
        checked as :meth:`load_state` checks them. By default they are the model's state;
        a walker whose framework saves names differently from its state maps them."""
        self.load_state(model, tensors, source)

    def notes(self, model: Any) -> list[str]:
        """What the target must reproduce that no tensor shows (e.g. a dropout layer that
        scales in eval), one line each; none by default."""
        return []

    @abstractmethod
    def trace(self, model: Any, inputs: np.ndarray) -> Trace:
        """Run ``model`` in eval mode on ``inputs`` (no gradients) with forward hooks on the
        layers of :meth:`layers`; the model is left in eval mode. For a model whose shapes
        are set on its first call, this is what sets them."""
