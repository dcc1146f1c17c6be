"""The sequence and transformer layers on the numpy backend: the reference's own forward
and backward (:mod:`polytrain.neutral.reference_seq`) wrapped as graph operations, so
the backend stays the reference's exact twin."""

from __future__ import annotations

import numpy as np

from polytrain.neutral import reference_seq
from polytrain.neutral.models import Layer, layer_parameters

from ._tensor import Grads, Tensor, add, record


def add_branches(outs: list[Tensor]) -> Tensor:
    """The element-wise sum of :class:`Add`'s branch outputs."""
    total = outs[0]
    for out in outs[1:]:
        total = add(total, out)
    return total


def run(layer: Layer, path: str, x: Tensor, params: dict[str, Tensor], train: bool) -> Tensor:
    """One leaf sequence/transformer layer on ``x``, by the reference's forward and backward
    (Reshape, BatchNorm1d and Add have their own runners in :mod:`._layers`)."""
    names = [f"{path}.{leaf}" for leaf in layer_parameters(layer)]
    weights = [params[n] for n in names]
    p = {n: t.data for n, t in zip(names, weights, strict=True)}

    def no_child(*_: object) -> np.ndarray:
        raise AssertionError("a leaf layer has no branches")

    with np.errstate(all="ignore"):
        out = reference_seq.forward(layer, path, p, x.data, train, no_child)

    def vjp(g: np.ndarray) -> Grads:
        grads: dict[str, np.ndarray] = {}
        with np.errstate(all="ignore"):
            gx = reference_seq.backward(layer, path, p, x.data, g, train, grads, no_child)
        return (gx if x.requires_grad else None, *(grads[n] for n in names))

    return record(np.asarray(out, dtype=out.dtype), (x, *weights), vjp)
