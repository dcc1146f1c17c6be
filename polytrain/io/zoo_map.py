"""A zoo map: the target's state dict (torchvision's, or transformers' for a template's
expansion), each tensor with its shape and the tensor of the zoo model's file that fills it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ZooTensor:
    """One entry of torchvision's state dict: its name and shape, and the tensor of the zoo
    model's file that fills it (None: the target's own, e.g. ``num_batches_tracked``)."""

    name: str
    shape: tuple[int, ...]
    native: str | None = None
    transposed: bool = False


@dataclass(frozen=True)
class ZooMap:
    """A shipped map: the zoo model ``key`` (``paddle:densenet121``) into ``torchvision``."""

    key: str
    framework: str  # the format of the zoo model's files
    label: str  # the zoo, for messages
    source: str  # how the zoo builds it, e.g. paddle.vision.models.vgg11(batch_norm=True)
    twin: str  # the torchvision twin, e.g. torchvision.models.vgg11_bn(weights=None)
    classes: int
    head: tuple[str, ...]  # torchvision names whose first dimension is the class count
    tensors: tuple[ZooTensor, ...]
    verified: Mapping[str, Any] = field(default_factory=dict)
    target: str = "torchvision"  # whose names the map writes, for messages
    notes: tuple[str, ...] = ()  # a template's expansion: what it read from the file

    def shape(self, tensor: ZooTensor, classes: int) -> tuple[int, ...]:
        """The canonical shape of ``tensor`` for a model of ``classes`` classes."""
        if tensor.name in self.head and classes != self.classes:
            return (classes, *tensor.shape[1:])
        return tensor.shape

    def ported(self) -> list[ZooTensor]:
        return [t for t in self.tensors if t.native is not None]

    def native_shapes(self, classes: int) -> dict[str, tuple[int, ...]]:
        """The zoo model's file: native name -> native shape."""
        out = {}
        for t in self.ported():
            shape = self.shape(t, classes)
            out[str(t.native)] = shape[::-1] if t.transposed else shape
        return out

    def target_shapes(self, classes: int, *, ported_only: bool = False) -> dict[str, Any]:
        """torchvision's state dict: name -> shape (only the tensors a file fills, or all)."""
        chosen = self.ported() if ported_only else self.tensors
        return {t.name: self.shape(t, classes) for t in chosen}

    def name_map(self, classes: int) -> dict[str, Any]:
        """The map in the JSON form of ``convert --map`` (for the zoo model's format)."""
        entries = {
            t.name: {"native": t.native, "transpose": t.transposed,
                     "shape": list(self.shape(t, classes))}
            for t in self.ported()
        }  # fmt: skip
        return {self.framework: entries}
