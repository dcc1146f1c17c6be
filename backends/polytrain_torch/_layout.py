"""Memory layout of polytrain's own convolutional models on a CPU.

oneDNN, torch's CPU convolution library, works in channels-last order: a model kept in
torch's default NCHW order pays a reorder of every convolution's input, output and
gradients on each call. Keeping the weights and the inputs channels-last removes them:
LeNet (batch 256, 2 threads, fp32) measured 1.5-1.8x faster eager and 1.0-1.3x faster
compiled on this project's 2-vCPU CPU (docs/performance.md, "Channels-last convolutions on
a CPU"). The values are the same tensors in another order; only the summation order inside
a convolution can differ (float32 rounding). It applies where it was measured and nowhere
else: models built from a polytrain spec (a user's module keeps the strides it was given),
float32 parameters (fp32 and the bf16/fp16 mixed precisions), CPU devices.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def wants_channels_last(
    module: nn.Module, devices: Sequence[torch.device], dtype: str, *, from_spec: bool
) -> bool:
    """Whether to keep ``module`` and its 4-d inputs in channels-last order."""
    return (
        from_spec
        and dtype == "float32"
        and all(torch.device(d).type == "cpu" for d in devices)
        and any(isinstance(m, nn.Conv2d) for m in module.modules())
    )


def to_channels_last(x: torch.Tensor) -> torch.Tensor:
    """A 4-d batch in channels-last order (a no-copy view when it already is, e.g. one
    channel); other ranks unchanged."""
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def _is_channels_last_only(x: torch.Tensor) -> bool:
    """4-d, channels-last and not also NCHW-contiguous (1x1 maps are both)."""
    return (
        x.dim() == 4
        and x.is_contiguous(memory_format=torch.channels_last)
        and not x.is_contiguous()
    )


def _channels_last_grad(grad: torch.Tensor) -> torch.Tensor:
    return grad.contiguous(memory_format=torch.channels_last)


class Flatten(nn.Flatten):
    """``nn.Flatten`` whose channels-last input gets its gradient back channels-last.

    Flattening a channels-last map copies it into NCHW order (the order the next Linear's
    weights are in), so autograd hands the layer before it an NCHW gradient; a channels-last
    pooling's backward given one takes its slow mixed-layout path (LeNet's second average
    pooling: 1.62 ms against 0.22 ms with the reorder included; docs/performance.md,
    "In-place ReLU and gradient layouts (torch)"). The values are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.requires_grad
            and torch.is_grad_enabled()
            and _is_channels_last_only(x)
            and not torch.compiler.is_compiling()  # inductor chooses its own layouts
            and not torch.jit.is_tracing()  # an exported graph has no backward
        ):
            x = x.view_as(x)  # the hook is the view's, not the caller's tensor's
            x.register_hook(_channels_last_grad)
        return super().forward(x)
