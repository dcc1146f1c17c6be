"""Functional ops (d2l's scratch recipes) with torch: the contract's own semantics."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from polytrain.backend.functional import Device, FunctionalOps, Tensor


def _placed(t: torch.Tensor, device: Device | None) -> torch.Tensor:
    """A copy of ``t`` on ``device``; an emulated ``cpu:K`` is host memory."""
    on_host = device is None or torch.device(device).type == "cpu"
    return t.to("cpu" if on_host else device, copy=True)


class TorchOps(FunctionalOps):
    # -- parameters and gradients ---------------------------------------------------------

    def parameter(self, value: Any, device: Device | None = None) -> Tensor:
        if isinstance(value, torch.Tensor):
            t = _placed(value.detach(), device)
        else:
            t = _placed(torch.from_numpy(np.ascontiguousarray(value)), device)
        t.requires_grad_()
        t.grad = torch.zeros_like(t)
        return t

    def grad(self, t: Tensor) -> Tensor:
        if t.grad is None:  # set to None by user code: give it a zero gradient again
            t.grad = torch.zeros_like(t)
        return t.grad

    def zero_grad(self, t: Tensor) -> None:
        self.grad(t).zero_()

    def copy_to(self, t: Tensor, device: Device) -> Tensor:
        return _placed(t.detach(), device)

    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        return torch.no_grad()

    def sgd_(self, params: Sequence[Tensor], lr: float, batch_size: int) -> None:
        with torch.no_grad():
            for p in params:
                g = self.grad(p)
                p -= lr * g / batch_size
                g.zero_()

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
        return F.avg_pool2d(x, kernel, stride or kernel, padding, count_include_pad=True)

    def max_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        return F.max_pool2d(x, kernel, stride or kernel, padding)

    def flatten(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], -1)

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.mm(a, b)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b
