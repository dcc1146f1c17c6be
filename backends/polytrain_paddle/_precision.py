"""Mixed precision on PaddlePaddle: ``paddle.amp.auto_cast`` (level O1) on GPUs.

On a CPU Paddle 3.3 registers no bfloat16/float16 kernels for conv2d and matmul, and
``auto_cast`` then does nothing (it warns and runs float32). :func:`support` measures that
with a tiny forward pass, so asking for bf16 or fp16 there is an error that says so, not
a silent float32 run. Activations cross devices through :class:`CopyTo`, because
``Tensor._copy_to`` is not differentiable.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import paddle
import paddle.nn.functional as F

from polytrain.backend.precision import PrecisionSupport
from polytrain.backend.precision_verbs import probe_float64

DTYPES: dict[str, Any] = {"bf16": "bfloat16", "fp16": "float16"}
_LOW = {"bf16": paddle.bfloat16, "fp16": paddle.float16}


@contextlib.contextmanager
def autocast(precision: str) -> Iterator[None]:
    with paddle.amp.auto_cast(enable=True, level="O1", dtype=DTYPES[precision]):
        yield


def unscale(grads: Sequence[Any], inv_scale: float) -> bool:
    """Scale the gradients in place; True if all are finite (one host sync)."""
    grads = [g for g in grads if g is not None]
    if not grads:
        return True
    with paddle.no_grad():
        for g in grads:
            g.scale_(inv_scale)
        finite = paddle.stack([paddle.isfinite(g).all() for g in grads]).all()
    return bool(finite.item())


@functools.cache
def support(place_kind: str, precision: str) -> PrecisionSupport:
    """Measured on ``place_kind`` ("cpu" or "gpu"): a convolution and a matmul under
    auto_cast must compute in the low precision."""
    if precision == "fp32":
        return PrecisionSupport("fp32", True)
    place = paddle.CPUPlace() if place_kind == "cpu" else paddle.CUDAPlace(0)
    if precision == "fp64":
        return probe_float64("paddle", lambda: _float64_dtypes(place), paddle.float64)
    try:
        with warnings.catch_warnings():  # auto_cast warns on CPU places, and does nothing
            warnings.simplefilter("ignore")
            x = paddle.randn([2, 1, 8, 8]).to(place)
            w = paddle.randn([4, 1, 3, 3]).to(place)
            with autocast(precision):
                h = F.conv2d(x, w)
                out = paddle.matmul(h.flatten(1), h.flatten(1).T)
    except Exception as exc:
        return PrecisionSupport(precision, False, f"paddle.amp.auto_cast failed: {exc}")
    if h.dtype != _LOW[precision] or out.dtype != _LOW[precision]:
        missing = (
            ""
            if _has_kernel(place, precision)
            else (f": Paddle {paddle.__version__} has no {DTYPES[precision]} matmul kernel there")
        )
        return PrecisionSupport(
            precision,
            False,
            f"paddle.amp.auto_cast does nothing on {place_kind} (conv2d and matmul stay "
            f"float32{missing}); training would silently run in float32",
        )
    return PrecisionSupport(
        precision, True, "with a dynamic loss scale" if precision == "fp16" else ""
    )


def _float64_dtypes(place: Any) -> tuple[Any, Any]:
    """A float64 convolution and dense layer, forward and backward on ``place``."""
    x = paddle.randn([2, 1, 8, 8], dtype="float64").to(place)
    w = paddle.randn([4, 1, 3, 3], dtype="float64").to(place)
    v = paddle.randn([144, 10], dtype="float64").to(place)
    w.stop_gradient = False
    out = paddle.matmul(F.conv2d(x, w).flatten(1), v)
    out.sum().backward()
    return out.dtype, None if w.grad is None else w.grad.dtype


def _has_kernel(place: Any, precision: str) -> bool:
    """Whether Paddle has a low-precision matmul kernel on this place at all."""
    try:
        a = paddle.ones([2, 2]).to(place).astype(DTYPES[precision])
        paddle.matmul(a, a)
    except Exception:  # NotFound: "The kernel with key (CPU, ..., bfloat16) ... not registered"
        return False
    return True


class CopyTo(paddle.autograd.PyLayer):
    """A copy to another place whose backward copies the gradient back."""

    @staticmethod
    def forward(ctx: Any, tensor: paddle.Tensor, place: Any) -> paddle.Tensor:
        ctx.source = tensor.place
        return tensor._copy_to(place, True)

    @staticmethod
    def backward(ctx: Any, grad: paddle.Tensor) -> paddle.Tensor:
        return grad._copy_to(ctx.source, True)
