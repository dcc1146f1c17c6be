"""Per-layer outputs (``Backend.layer_outputs``) through the framework's forward hooks: the
layers worth a look, and capturing what each one returns during one forward pass."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

Layer = Any
Hook = Callable[[Any, Any, Any], None]  # (layer, inputs, output), as every framework calls it
Children = Callable[[Layer], Iterable[tuple[str, Layer]]]
RESIDUAL = "_Residual"  # the class name of the backends' residual blocks


def inspected_layers(root: Layer, children: Children) -> list[tuple[str, Layer]]:
    """Leaf layers, plus residual blocks (whose sum and ReLU live in their forward), in
    depth-first order, with dotted names; a layer reached twice is listed once."""
    found: list[tuple[str, Layer]] = []
    seen = {id(root)}

    def walk(layer: Layer, prefix: str) -> None:
        for name, child in children(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{prefix}.{name}" if prefix else name
            if not any(True for _ in children(child)) or type(child).__name__ == RESIDUAL:
                found.append((path, child))
            walk(child, path)

    walk(root, "")
    return found


def capture_outputs(
    layers: Iterable[tuple[str, Layer]],
    attach: Callable[[Layer, Hook], Callable[[], object]],
    to_numpy: Callable[[Any], np.ndarray],
    run: Callable[[], object],
) -> list[tuple[str, np.ndarray]]:
    """``(name, output)`` of every layer, in the order they ran during ``run()``.
    ``attach(layer, hook)`` registers a forward hook and returns what removes it;
    ``to_numpy`` copies an output to a float32 numpy array. Hooks go, whatever happens."""
    captured: list[tuple[str, np.ndarray]] = []

    def hook(name: str) -> Hook:
        def record(_layer: Any, _inputs: Any, output: Any) -> None:
            captured.append((name, to_numpy(output)))

        return record

    removers = [attach(layer, hook(name)) for name, layer in layers]
    try:
        run()
    finally:
        for remove in removers:
            remove()
    return captured
