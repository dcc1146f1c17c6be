"""Functional ops (d2l's scratch recipes) on numpy tensors, PyTorch's semantics."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from polytrain.backend.functional import Device, FunctionalOps

from . import _autograd as A
from ._tensor import CPU, Tensor, add, no_grad


class NumpyOps(FunctionalOps):
    # -- parameters and gradients ---------------------------------------------------------

    def parameter(self, value: Any, device: Device | None = None) -> Tensor:
        data = value.data if isinstance(value, Tensor) else value
        return Tensor.leaf(np.array(data, copy=True, order="C"), device or CPU)

    def grad(self, t: Tensor) -> Tensor:
        if t.grad is None:
            t.grad = np.zeros_like(t.data)
        return Tensor(t.grad, t.device)  # an alias: writing into it changes the gradient

    def zero_grad(self, t: Tensor) -> None:
        self.grad(t).data.fill(0)

    def copy_to(self, t: Tensor, device: Device) -> Tensor:
        return Tensor(t.data.copy(), device)

    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        return no_grad()

    def sgd_(self, params: Sequence[Tensor], lr: float, batch_size: int) -> None:
        with np.errstate(all="ignore"):
            for p in params:
                g = self.grad(p).data
                p.data -= lr * g / batch_size
                g.fill(0)

    # -- layers ---------------------------------------------------------------------------

    def conv2d(
        self, x: Tensor, w: Tensor, b: Tensor | None = None, stride: int = 1, padding: int = 0
    ) -> Tensor:
        return A.conv2d(x, w, b, stride, padding)

    def relu(self, x: Tensor) -> Tensor:
        return A.relu(x)

    def avg_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        return A.avg_pool2d(x, kernel, stride or kernel, padding)

    def max_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        return A.max_pool2d(x, kernel, stride or kernel, padding)

    def flatten(self, x: Tensor) -> Tensor:
        return A.flatten(x)

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return A.matmul(a, b)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return add(a, b)
