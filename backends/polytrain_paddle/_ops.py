"""Functional ops (d2l's scratch recipes) with Paddle, in PyTorch's semantics.

Where Paddle differs: a leaf records gradients when ``stop_gradient=False``; its
gradient is created by the first backward (so :meth:`PaddleOps.parameter` sets a zero
one at once); ``avg_pool2d`` excludes padding unless ``exclusive=False``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from polytrain.backend.functional import Device, FunctionalOps, Tensor

from ._devices import place


def _placed(t: paddle.Tensor, device: Device | None) -> paddle.Tensor:
    """``t`` on ``device`` (an emulated ``cpu:K`` is the one CPU place), always a copy."""
    to = place(device)
    return t.clone() if t.place == to else t.to(to)


class PaddleOps(FunctionalOps):
    # -- parameters and gradients ---------------------------------------------------------

    def parameter(self, value: Any, device: Device | None = None) -> Tensor:
        if isinstance(value, paddle.Tensor):
            t = _placed(value.detach(), device)
        else:
            t = paddle.to_tensor(np.array(value, copy=True, order="C"), place=place(device))
        t.stop_gradient = False
        t.grad = paddle.zeros_like(t)
        return t

    def grad(self, t: Tensor) -> Tensor:
        if t.grad is None:
            t.grad = paddle.zeros_like(t)
        return t.grad

    def zero_grad(self, t: Tensor) -> None:
        t.clear_gradient(set_to_zero=True)

    def copy_to(self, t: Tensor, device: Device) -> Tensor:
        return _placed(t.detach(), device)

    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        return paddle.no_grad()

    def sgd_(self, params: Sequence[Tensor], lr: float, batch_size: int) -> None:
        with paddle.no_grad():
            for p in params:
                p.subtract_(lr * self.grad(p) / batch_size)
                self.zero_grad(p)

    # -- layers ---------------------------------------------------------------------------

    def conv2d(
        self, x: Tensor, w: Tensor, b: Tensor | None = None, stride: int = 1, padding: int = 0
    ) -> Tensor:
        return F.conv2d(x, w, b, stride=stride, padding=padding)

    def relu(self, x: Tensor) -> Tensor:
        return F.relu(x)

    def avg_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        # exclusive=False: padding counts in the average, as in torch (Paddle: excluded)
        return F.avg_pool2d(x, kernel, stride or kernel, padding, exclusive=False)

    def max_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        return F.max_pool2d(x, kernel, stride or kernel, padding)

    def flatten(self, x: Tensor) -> Tensor:
        return paddle.flatten(x, start_axis=1)

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return paddle.matmul(a, b)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b
