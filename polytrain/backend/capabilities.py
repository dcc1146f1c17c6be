"""What a backend declares it supports, read without importing its framework
(:attr:`polytrain.plugins.info.BackendInfo.capabilities`): the conformance suite skips,
with the reason, what a backend does not declare, and ``polytrain backends --json``
lists the declarations. A plugin that declares nothing supports everything below (the
built-in backends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polytrain.neutral.models import LAYER_TYPES, Add, Layer, Residual, Sequential

DTYPES = ("float32", "float64")
DEVICES = ("cpu", "cpu:N", "gpu")  # cpu:N: emulated devices in one process
#: in-place: allreduce/broadcast change the tensors they get; returned: all_reduced/
#: broadcasted return new ones (every backend, by default through the in-place verbs);
#: processes: both across the processes of a job (init_distributed)
COLLECTIVES = ("in-place", "returned", "processes")


@dataclass(frozen=True)
class Capabilities:
    """Layer types (class names of :mod:`polytrain.neutral.models`), dtypes of a model,
    device kinds and collectives a backend supports."""

    layers: tuple[str, ...] = tuple(LAYER_TYPES)
    dtypes: tuple[str, ...] = DTYPES
    devices: tuple[str, ...] = DEVICES
    collectives: tuple[str, ...] = COLLECTIVES

    def missing_layers(self, layer: Layer) -> list[str]:
        """The layer types in ``layer`` (a spec's net, walked) that are not declared."""
        return sorted(layer_types(layer) - set(self.layers))

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": list(self.layers),
            "dtypes": list(self.dtypes),
            "devices": list(self.devices),
            "collectives": list(self.collectives),
        }


def layer_types(layer: Layer) -> set[str]:
    """The class names of ``layer`` and of every layer inside it, containers included."""
    if isinstance(layer, Sequential):
        children: list[Any] = [child for _, child in layer.layers]
    elif isinstance(layer, Residual):
        children = [layer.body] + ([layer.shortcut] if layer.shortcut is not None else [])
    elif isinstance(layer, Add):
        children = list(layer.branches)
    else:
        children = []
    return {type(layer).__name__}.union(*(layer_types(c) for c in children))
