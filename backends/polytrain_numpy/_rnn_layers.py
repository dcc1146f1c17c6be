"""LSTM and GRU on the numpy backend: the reference's own forward and backward through
time (:mod:`polytrain.neutral.reference_rnn`) as one graph operation, in the tensor's
dtype, so the backend stays the reference's exact twin."""

from __future__ import annotations

import numpy as np

from polytrain.neutral import reference_rnn
from polytrain.neutral.models import GRU, LSTM, layer_parameters

from ._tensor import Grads, Tensor, record


def recurrent(layer: LSTM | GRU, path: str, x: Tensor, params: dict[str, Tensor]) -> Tensor:
    """The layer's output sequence [N, T, H] for x [N, T, input_size]."""
    leaves = list(layer_parameters(layer))
    weights = [params[f"{path}.{leaf}"] for leaf in leaves]
    arrays = {leaf: t.data for leaf, t in zip(leaves, weights, strict=True)}
    with np.errstate(all="ignore"):
        out, caches = reference_rnn.recurrent(layer, arrays, x.data)

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            gx, grads = reference_rnn.recurrent_backward(layer, arrays, caches, g)
        return (gx if x.requires_grad else None, *(grads[leaf] for leaf in leaves))

    return record(np.ascontiguousarray(out), (x, *weights), vjp)
