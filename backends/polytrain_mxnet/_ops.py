"""Functional ops (d2l's scratch recipes) with mx.nd, in PyTorch's semantics.

Where MXNet differs: operations are differentiated only inside ``autograd.record()``
(the backend's ``record``); ``attach_grad`` overwrites the gradient at each backward
unless ``grad_req='add'``, which gives PyTorch's accumulation; ``copyto`` is recorded
like any operation unless paused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd

from polytrain.backend.functional import Device, FunctionalOps, Tensor


class MXNetOps(FunctionalOps):
    # -- parameters and gradients ---------------------------------------------------------

    def parameter(self, value: Any, device: Device | None = None) -> Tensor:
        ctx = device or mx.cpu()
        if isinstance(value, mx.nd.NDArray):
            with autograd.pause():
                t = value.copyto(ctx)
        else:
            array = np.asarray(value)
            t = mx.nd.array(array, ctx=ctx, dtype=array.dtype)
        t.attach_grad(grad_req="add")  # accumulate over backward calls, as torch does
        return t

    def grad(self, t: Tensor) -> Tensor:
        return t.grad

    def zero_grad(self, t: Tensor) -> None:
        t.grad[:] = 0

    def copy_to(self, t: Tensor, device: Device) -> Tensor:
        with autograd.pause():
            return t.copyto(device)

    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        return autograd.pause()

    def sgd_(self, params: Sequence[Tensor], lr: float, batch_size: int) -> None:
        with autograd.pause():
            for p in params:
                p -= lr * p.grad / batch_size
                p.grad[:] = 0

    # -- layers ---------------------------------------------------------------------------

    def conv2d(
        self, x: Tensor, w: Tensor, b: Tensor | None = None, stride: int = 1, padding: int = 0
    ) -> Tensor:
        return mx.nd.Convolution(
            data=x,
            weight=w,
            bias=b,
            kernel=tuple(w.shape[2:]),
            num_filter=w.shape[0],
            stride=(stride, stride),
            pad=(padding, padding),
            no_bias=b is None,
        )

    def relu(self, x: Tensor) -> Tensor:
        return mx.nd.relu(x)

    def avg_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        return self._pool(x, "avg", kernel, stride, padding)

    def max_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        return self._pool(x, "max", kernel, stride, padding)

    def _pool(self, x: Tensor, kind: str, kernel: int, stride: int | None, padding: int) -> Tensor:
        s = stride or kernel
        return mx.nd.Pooling(
            data=x,
            pool_type=kind,
            kernel=(kernel, kernel),
            stride=(s, s),
            pad=(padding, padding),
            pooling_convention="valid",  # round down, as torch without ceil_mode
            count_include_pad=True,
        )

    def flatten(self, x: Tensor) -> Tensor:
        return mx.nd.flatten(x)

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return mx.nd.dot(a, b)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return mx.nd.broadcast_add(a, b)
