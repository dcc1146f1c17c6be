"""The named losses of :mod:`polytrain.neutral.losses` with MXNet's ndarray operators.

Cross-entropy's ``log_softmax`` runs in float64, as the ``cross_entropy`` verb's does
(MXNet's float32 log_softmax is biased by up to ~15 ulp)."""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from polytrain.backend.reduction import reduce_samples
from polytrain.neutral.losses import LossSpec, class_positions


def named_loss(outputs: Any, targets: Any, spec: LossSpec, reduction: str) -> Any:
    """Per sample the mean over its output elements (sequence targets: over its positions);
    then ``reduction`` over samples."""
    dtype = "float64" if outputs.dtype == np.float64 else "float32"
    n = outputs.shape[0]
    if spec.class_targets:
        positions = class_positions(tuple(outputs.shape), tuple(targets.shape))
        classes = outputs.shape[-1]  # [N * T, C]: the class axis is the last
        rows = outputs.reshape((-1, classes))
        logp = mx.nd.log_softmax(rows.astype("float64"), axis=1)
        onehot = mx.nd.one_hot(targets.reshape((-1,)), classes, dtype="float64")
        eps = spec.label_smoothing
        coef = (1.0 - eps) * onehot + eps / classes
        if spec.class_weights is not None:
            weights = mx.nd.array(spec.class_weights, ctx=outputs.context, dtype="float64")
            coef = mx.nd.broadcast_mul(coef, weights.reshape((1, classes)))
        per = -(coef * logp).sum(axis=1)
        if positions > 1:
            per = per.reshape((n, positions)).mean(axis=1)
        return reduce_samples(per, reduction).astype(dtype)
    z = outputs.astype(dtype).reshape((n, -1))
    t = targets.astype(dtype).reshape(z.shape)
    if spec.name == "mse":
        elements = (z - t) ** 2
    elif spec.name == "l1":
        elements = mx.nd.abs(z - t)
    else:  # the stable form, as gluon's SigmoidBinaryCrossEntropyLoss(from_sigmoid=False)
        elements = mx.nd.relu(z) - z * t + mx.nd.Activation(-mx.nd.abs(z), act_type="softrelu")
    return reduce_samples(elements.mean(axis=1), reduction)
