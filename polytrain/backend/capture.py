"""Per-layer outputs (``Backend.layer_outputs``) through the framework's forward hooks: the
layers worth a look, and capturing what each one returns during one forward pass."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytrain.backend.model import Model
from polytrain.neutral import models

Layer = Any
Hook = Callable[[Any, Any, Any], None]  # (layer, inputs, output), as every framework calls it
Children = Callable[[Layer], Iterable[tuple[str, Layer]]]
RESIDUAL = "_Residual"  # the class name of the backends' residual blocks


def spec_paths(spec: models.ModelSpec) -> set[str]:
    """The canonical paths whose outputs are reported: every leaf layer of the spec, and
    every Residual and Add (their sums live in their forward), as the numpy backend does."""
    paths: set[str] = set()

    def visit(layer: models.Layer, path: str) -> None:
        if isinstance(layer, models.Residual | models.Add):
            paths.add(path)
        if not isinstance(layer, models.Sequential | models.Residual | models.Add):
            paths.add(path)
        for name, child in _spec_children(layer):
            visit(child, f"{path}.{name}" if path else name)

    visit(spec.net, "")
    return paths


def _spec_children(layer: models.Layer) -> list[tuple[str, models.Layer]]:
    if isinstance(layer, models.Sequential):
        return list(layer.layers)
    if isinstance(layer, models.Residual):
        short = [] if layer.shortcut is None else [("shortcut", layer.shortcut)]
        return [("body", layer.body), *short]
    if isinstance(layer, models.Add):
        return [(f"branches.{i}", b) for i, b in enumerate(layer.branches)]
    return []


def inspected_layers(
    root: Layer, children: Children, paths: Collection[str] | None = None
) -> list[tuple[str, Layer]]:
    """The native layers at ``paths`` (:func:`spec_paths` of the model's spec: a framework's
    attention keeps sublayers and an identity branch is an empty container, which the spec
    says are neither), or without them leaf layers plus residual blocks (whose sum and ReLU
    live in their forward), in depth-first order, with dotted names; a layer reached twice
    is listed once."""
    found: list[tuple[str, Layer]] = []
    seen = {id(root)}

    def listed(path: str, child: Layer) -> bool:
        if paths is not None:
            return path in paths
        return not any(True for _ in children(child)) or type(child).__name__ == RESIDUAL

    def walk(layer: Layer, prefix: str) -> None:
        for name, child in children(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{prefix}.{name}" if prefix else name
            if listed(path, child):
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


@dataclass(frozen=True)
class ForwardHooks:
    """What a framework lends :meth:`layer_outputs`: a layer's ``(name, child)`` pairs, how
    a forward hook is attached (returning its remover), and an output's float32 host copy."""

    children: Children
    attach: Callable[[Layer, Hook], Callable[[], object]]
    to_numpy: Callable[[Any], np.ndarray]

    def layers(self, model: Model) -> list[tuple[str, Layer]]:
        """The model's first replica's inspected layers (the spec's paths where it has one)."""
        paths = None if model.spec is None else spec_paths(model.spec)
        return inspected_layers(model.replicas[0], self.children, paths)

    def layer_outputs(
        self,
        model: Model,
        run: Callable[[], object],
        layers: Iterable[tuple[str, Layer]] | None = None,
    ) -> list[tuple[str, np.ndarray]]:
        """Every inspected layer's output while ``run()`` does one forward pass."""
        chosen = self.layers(model) if layers is None else layers
        return capture_outputs(chosen, self.attach, self.to_numpy, run)
