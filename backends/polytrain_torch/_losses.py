"""The named losses of :mod:`polytrain.neutral.losses` with torch's own functions."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polytrain.backend.reduction import reduce_samples
from polytrain.neutral.losses import LossSpec, class_positions


def named_loss(
    outputs: torch.Tensor, targets: torch.Tensor, spec: LossSpec, reduction: str
) -> torch.Tensor:
    """Per sample the mean over its output elements (sequence targets: over its positions);
    then ``reduction`` over samples."""
    if outputs.dtype in (torch.float16, torch.bfloat16):  # mixed precision: an fp32 loss
        outputs = outputs.float()
    n = outputs.shape[0]
    if spec.class_targets:
        positions = class_positions(tuple(outputs.shape), tuple(targets.shape))
        weight = None
        if spec.class_weights is not None:
            weight = torch.tensor(spec.class_weights, dtype=outputs.dtype, device=outputs.device)
        per = F.cross_entropy(
            outputs.reshape(-1, outputs.shape[-1]),  # [N * T, C]: the class axis is the last
            targets.reshape(-1),
            weight=weight,
            label_smoothing=spec.label_smoothing,
            reduction="none",
        )
        if positions > 1:
            per = per.reshape(n, positions).mean(dim=1)
        return reduce_samples(per, reduction)
    z = outputs.reshape(n, -1)
    t = targets.to(z.dtype).reshape(z.shape)
    if spec.name == "mse":
        elements = F.mse_loss(z, t, reduction="none")
    elif spec.name == "l1":
        elements = F.l1_loss(z, t, reduction="none")
    else:
        elements = F.binary_cross_entropy_with_logits(z, t, reduction="none")
    return reduce_samples(elements.mean(dim=1), reduction)
