"""The named losses of :mod:`polytrain.neutral.losses`: the numpy references themselves,
computed in float64, as one differentiable operation."""

from __future__ import annotations

import numpy as np

from polytrain.backend.reduction import reduce_samples
from polytrain.neutral.losses import LossSpec, loss_grad_reference, loss_per_sample

from ._tensor import Grads, Tensor, record


def named_loss(outputs: Tensor, targets: Tensor, spec: LossSpec, reduction: str) -> Tensor:
    """Per sample the mean over its output elements; then ``reduction`` over samples."""
    z, t = outputs.data, np.asarray(targets.data)
    dtype = z.dtype
    with np.errstate(all="ignore"):
        per = loss_per_sample(spec, z, t)
    n = len(per)
    out = np.asarray(reduce_samples(per, reduction))

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            grad = loss_grad_reference(spec, z, t)  # of the per-sample sum
            if reduction == "none":
                grad = grad * np.asarray(g, np.float64).reshape((n,) + (1,) * (grad.ndim - 1))
            else:
                grad = grad * (float(g) / (n if reduction == "mean" else 1))
        return grad.astype(dtype), None

    return record(out.astype(dtype), (outputs, targets), vjp)
