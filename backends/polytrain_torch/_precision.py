"""Mixed precision on PyTorch: ``torch.autocast`` and the fused unscale of ``torch.amp``.

Parameters stay float32; autocast runs convolutions and matmuls in the low precision and
keeps the loss in float32. The dynamic loss scale is polytrain's (framework-free, in
:mod:`polytrain.backend.precision`); here are only the framework's parts of it. fp64 needs no
autocast: the model is built in float64.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from polytrain.backend.precision import PrecisionSupport, cpu_flags
from polytrain.backend.precision_verbs import probe_float64

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def autocast(precision: str) -> Iterator[None]:
    """Autocast on the CPU, and on CUDA too when there is one (a model may span both)."""
    dtype = DTYPES[precision]
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", dtype=dtype))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", dtype=dtype))
        yield


def unscale(grads: Sequence[torch.Tensor | None], inv_scale: float) -> bool:
    """Multiply the gradients by ``inv_scale`` in place; True if all are finite. One fused
    kernel per device and dtype (GradScaler's own op), one host sync at the end."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        if g is not None:
            groups.setdefault((g.device, g.dtype), []).append(g)
    flags = []
    for (device, _), group in groups.items():
        found_inf = torch.zeros(1, device=device)
        inv = torch.full((1,), inv_scale, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv)
        flags.append(found_inf.to("cpu"))
    return not any(bool(f.item()) for f in flags)


@functools.cache
def support(device_type: str, precision: str) -> PrecisionSupport:
    """Measured: a small convolution and dense layer forward and backward under autocast on
    ``device_type`` ("cpu" or "cuda") must compute in the low precision."""
    if precision == "fp32":
        return PrecisionSupport("fp32", True)
    if precision == "fp64":
        return probe_float64("torch", lambda: _float64_dtypes(device_type), torch.float64)
    dtype = DTYPES[precision]
    try:
        device = torch.device(device_type)
        x = torch.randn(2, 1, 8, 8, device=device)
        w = torch.randn(4, 1, 3, 3, device=device, requires_grad=True)
        v = torch.randn(10, 144, device=device, requires_grad=True)
        with torch.autocast(device_type, dtype=dtype):
            h = F.conv2d(x, w)
            out = F.linear(h.flatten(1), v)
        out.float().sum().backward()
    except Exception as exc:  # the framework's refusal is the reason
        return PrecisionSupport(precision, False, f"torch autocast failed: {exc}")
    if h.dtype != dtype or out.dtype != dtype:
        return PrecisionSupport(
            precision, False, f"torch autocast on {device_type} left {h.dtype} (would be fp32)"
        )
    return PrecisionSupport(precision, True, _note(device_type, precision))


def _float64_dtypes(device_type: str) -> tuple[torch.dtype, torch.dtype | None]:
    """A float64 convolution and dense layer, forward and backward on ``device_type``."""
    device = torch.device(device_type)
    x = torch.randn(2, 1, 8, 8, device=device, dtype=torch.float64)
    w = torch.randn(4, 1, 3, 3, device=device, dtype=torch.float64, requires_grad=True)
    v = torch.randn(10, 144, device=device, dtype=torch.float64, requires_grad=True)
    out = F.linear(F.conv2d(x, w).flatten(1), v)
    out.sum().backward()
    return out.dtype, None if w.grad is None else w.grad.dtype


def _note(device_type: str, precision: str) -> str:
    if device_type != "cpu":
        return "with a dynamic loss scale" if precision == "fp16" else ""
    flags = cpu_flags()
    if precision == "fp16":
        fast = {"avx512_fp16", "amx_fp16"} & flags
        return "with a dynamic loss scale" + (
            "" if fast else "; slow on this CPU (no fp16 matmul units): 3-13x fp32's step time"
        )
    native = sorted({"avx512_bf16", "amx_bf16"} & flags)
    return f"CPU has {', '.join(native)}" if native else "emulated on this CPU (no bf16 units)"
