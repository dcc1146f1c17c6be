"""The named losses of :mod:`polytrain.neutral.losses` with paddle's functions.

Cross-entropy with smoothing or class weights is written from ``log_softmax`` and a one-hot
of the labels (the reference's formula), so that the per-sample value is PyTorch's."""

from __future__ import annotations

from typing import Any

import paddle
import paddle.nn.functional as F

from polytrain.backend.reduction import reduce_samples
from polytrain.neutral.losses import LossSpec, class_positions


def named_loss(outputs: Any, targets: Any, spec: LossSpec, reduction: str) -> Any:
    """Per sample the mean over its output elements (sequence targets: over its positions);
    then ``reduction`` over samples."""
    if outputs.dtype in (paddle.float16, paddle.bfloat16):  # mixed precision: an fp32 loss
        outputs = outputs.astype("float32")
    n = outputs.shape[0]
    if spec.class_targets:
        positions = class_positions(tuple(outputs.shape), tuple(targets.shape))
        classes = outputs.shape[-1]  # [N * T, C]: the class axis is the last
        logp = F.log_softmax(outputs.reshape([-1, classes]), axis=1)
        onehot = F.one_hot(targets.reshape([-1]), classes).astype(outputs.dtype)
        eps = spec.label_smoothing
        coef = (1.0 - eps) * onehot + eps / classes
        if spec.class_weights is not None:
            weights = paddle.to_tensor(spec.class_weights, dtype=outputs.dtype)
            coef = coef * weights.reshape([1, classes])
        per = -(coef * logp).sum(axis=1)
        if positions > 1:
            per = per.reshape([n, positions]).mean(axis=1)
        return reduce_samples(per, reduction)
    z = outputs.reshape([n, -1])
    t = targets.astype(z.dtype).reshape(z.shape)
    if spec.name == "mse":
        elements = F.mse_loss(z, t, reduction="none")
    elif spec.name == "l1":
        elements = F.l1_loss(z, t, reduction="none")
    else:
        elements = F.binary_cross_entropy_with_logits(z, t, reduction="none")
    return reduce_samples(elements.mean(axis=1), reduction)
