"""Zero channels that let oneDNN run MXNet's float32 CPU convolutions with its direct kernels.

oneDNN's fast CPU convolutions use blocked layouts (16 channels a block on AVX-512, 8 on
AVX2), which round a channel count up to a whole block. MXNet 1.9.1 keeps every array at
its own size, so it refuses any layout that pads and takes oneDNN's next implementation,
until it reaches the im2col + gemm kernel on plain NCHW (``x64:gemm:jit``). LeNet's 20 and
50 channels take that path in MXNet, in any Gluon model; with 32 and 64 they run oneDNN's
direct kernels (docs/performance.md, "MXNet's convolution channels").

Inside a hybridized :class:`_Sequential`, a run of convolutions, ReLUs and poolings is
traced with the convolutions' channels padded to a multiple of :data:`BLOCK` where that was
measured faster (:func:`plan_channels`), by zero weights and zero biases (concatenated in
the graph: the parameters keep their shapes and names), and the padding sliced off where
the run ends. A padded output channel is ``relu(0) = 0`` and pools to 0; the next
convolution's zero weights read it, so the real channels get the same sums plus exact
zeros (float32 rounding may differ: another kernel adds in another order). Only float32 on
a CPU and outside autocast; imperative calls (evaluation under ``--no-fast``,
``--inspect``) run the plain layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np

from polytrain.neutral import models

#: the channel multiple that fits oneDNN's widest CPU block (AVX-512; AVX2's 8 divides it)
BLOCK = 16

_PASS_THROUGH = (models.ReLU, models.MaxPool2d, models.AvgPool2d)  # map 0 to 0, per channel


@dataclass(frozen=True)
class PaddedConv:
    """One convolution's extra zero input and output channels."""

    extra_in: int
    extra_out: int


@dataclass(frozen=True)
class ChannelPlan:
    """Which children of a Sequential run padded: ``convs`` by child index, and the
    indices before which the padding is sliced off (``len(children)``: at the end)."""

    convs: dict[int, PaddedConv]
    slices: dict[int, int]  # child index -> real channel count to keep


def padded_channels(n: int) -> int:
    """``n`` channels rounded up to a whole number of blocks."""
    return -(-n // BLOCK) * BLOCK


def _worth_padding(channels: int) -> bool:
    """Measured (docs/performance.md): oneDNN already runs a multiple of 8 channels with
    its 8-wide kernels; other counts gain from padding when it adds at most 60 %."""
    return channels % 8 != 0 and padded_channels(channels) * 5 <= channels * 8


def _plain_input_reads_fast(channels: int) -> bool:
    """An unpadded input oneDNN's direct kernels take as it is: whole blocks, or an
    image's 1 or 3 channels (its first-layer kernels; 6 and 12 measured slower)."""
    return channels % BLOCK == 0 or channels in (1, 3)


def plan_channels(layers: list[models.Layer]) -> ChannelPlan | None:
    """The padding for a Sequential's children, or None where no convolution gains.

    A convolution's output is padded when its channel count is worth it and its input
    is padded here or read fast as it is; a padded input reaches a convolution whose own
    output stays unpadded only through a slice (else oneDNN would fall back to gemm on
    the padded channels)."""
    convs: dict[int, PaddedConv] = {}
    slices: dict[int, int] = {}
    padded: int | None = None  # the padded channel count flowing, or None
    real = 0
    for i, layer in enumerate(layers):
        if isinstance(layer, models.Conv2d):
            ic, oc = layer.in_channels, layer.out_channels
            pad_out = _worth_padding(oc) and (padded is not None or _plain_input_reads_fast(ic))
            out = padded_channels(oc) if pad_out else oc
            if padded is not None and out % BLOCK:
                slices[i] = real
                padded = None
            extra_in = 0 if padded is None else padded - ic
            if extra_in or out != oc:
                convs[i] = PaddedConv(extra_in, out - oc)
            padded, real = (out, oc) if out != oc else (None, 0)
        elif padded is not None and not isinstance(layer, _PASS_THROUGH):
            slices[i] = real
            padded = None
    if padded is not None:
        slices[len(layers)] = real
    return ChannelPlan(convs, slices) if convs else None


def applies(blocks: list[Any], F: Any, plan: ChannelPlan, autocast: bool) -> bool:
    """Whether a trace pads: a symbol trace, float32 CPU parameters, no autocast."""
    if F is not mx.sym or autocast:
        return False
    for i in plan.convs:
        weight = blocks[i].weight
        if np.dtype(weight.dtype) != np.float32:
            return False
        if any(ctx.device_type != "cpu" for ctx in weight.list_ctx()):
            return False
    return True


def padded_conv(F: Any, conv: Any, x: Any, pad: PaddedConv) -> Any:
    """Gluon ``Conv2D`` ``conv`` on ``x`` with its weights and bias padded by zeros."""
    oc, ic, kh, kw = conv.weight.shape
    weight = conv.weight.var()
    if pad.extra_out:
        weight = F.concat(weight, F.zeros((pad.extra_out, ic, kh, kw)), dim=0)
    if pad.extra_in:
        weight = F.concat(weight, F.zeros((oc + pad.extra_out, pad.extra_in, kh, kw)), dim=1)
    kwargs = {**conv._kwargs, "num_filter": oc + pad.extra_out}
    if conv.bias is None:
        return F.Convolution(x, weight, **kwargs)
    bias = conv.bias.var()
    if pad.extra_out:
        bias = F.concat(bias, F.zeros((pad.extra_out,)), dim=0)
    return F.Convolution(x, weight, bias, **kwargs)


def run_padded(F: Any, x: Any, blocks: list[Any], plan: ChannelPlan) -> Any:
    """The children in order, along ``plan``."""
    for i, block in enumerate(blocks):
        if i in plan.slices:
            x = F.slice_axis(x, axis=1, begin=0, end=plan.slices[i])
        pad = plan.convs.get(i)
        x = block(x) if pad is None else padded_conv(F, block, x, pad)
    if len(blocks) in plan.slices:
        x = F.slice_axis(x, axis=1, begin=0, end=plan.slices[len(blocks)])
    return x
