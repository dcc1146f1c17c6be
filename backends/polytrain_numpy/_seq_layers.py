"""The sequence and transformer layers on the numpy backend: the reference's own forward
and backward (:mod:`polytrain.neutral.reference_seq`) wrapped as graph operations, so
the backend stays the reference's exact twin."""

from __future__ import annotations

import numpy as np

from polytrain.neutral import reference_seq
from polytrain.neutral.models import BatchNorm1d, Layer, Reshape, layer_parameters

from . import _autograd as A
from ._tensor import Grads, Tensor, add, record


def run(
    layer: Layer,
    path: str,
    x: Tensor,
    params: dict[str, Tensor],
    buffers: dict[str, np.ndarray],
    train: bool,
) -> Tensor:
    """One leaf sequence/transformer layer on ``x`` (Add is run by the net, branch by branch)."""
    if isinstance(layer, Reshape):
        return A.reshape(x, (x.shape[0], *layer.shape))
    if isinstance(layer, BatchNorm1d):  # BatchNorm2d's kernels on [N, C, L, 1]
        y = A.batch_norm(
            A.reshape(x, (x.shape[0], x.shape[1], -1, 1)),
            params[f"{path}.weight"],
            params[f"{path}.bias"],
            buffers[f"{path}.running_mean"],
            buffers[f"{path}.running_var"],
            layer.eps,
            layer.momentum,
            train,
        )
        return A.reshape(y, x.shape)
    return _leaf(layer, path, x, params, train)


def add_branches(outs: list[Tensor]) -> Tensor:
    """The element-wise sum of :class:`Add`'s branch outputs."""
    total = outs[0]
    for out in outs[1:]:
        total = add(total, out)
    return total


def _leaf(layer: Layer, path: str, x: Tensor, params: dict[str, Tensor], train: bool) -> Tensor:
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
