"""Functional ops (d2l's scratch recipes) on the jax backend, PyTorch's semantics:
parameters are mutable holders (:class:`._recorded.Parameter`), every op is recorded on
the lazy tape of :mod:`._recorded`, ``backward`` differentiates the recorded function.
A gradient is a handle on its parameter (:class:`._recorded.GradHandle`): ``allreduce``
of handles writes the sums back, as d2l's hand-written all-reduce expects."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from polytrain.backend.functional import Device, FunctionalOps

from ._model import x64
from ._net import conv, linear, pool_divisor
from ._recorded import GradHandle, Parameter, lift, no_grad, value


def _device(backend: Any, device: Device | None) -> Any:
    return (device or backend.device("cpu")).device


class JaxOps(FunctionalOps):
    # -- parameters and gradients ---------------------------------------------------------

    def parameter(self, value_: Any, device: Device | None = None) -> Any:
        with x64():
            array = np.array(value(value_), copy=True)
            return Parameter(jax.device_put(array, _device(self.backend, device)))

    def grad(self, t: Any) -> Any:
        return GradHandle(t)

    def zero_grad(self, t: Any) -> None:
        with x64():
            t.grad = t.grad * 0

    def copy_to(self, t: Any, device: Device) -> Any:
        with x64():
            return jax.device_put(np.array(value(t)), device.device)

    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        return no_grad()

    def sgd_(self, params: Sequence[Any], lr: float, batch_size: int) -> None:
        with x64():
            for p in params:
                p.value = p.value - lr * p.grad / batch_size
                p.grad = p.grad * 0

    # -- layers ---------------------------------------------------------------------------

    def _op(self, f: Any, *args: Any) -> Any:
        with x64():
            return lift(f, *args)

    def conv2d(
        self, x: Any, w: Any, b: Any | None = None, stride: int = 1, padding: int = 0
    ) -> Any:
        if b is None:
            return self._op(lambda x_, w_: conv(x_, w_, None, stride, padding, "HW"), x, w)
        return self._op(lambda x_, w_, b_: conv(x_, w_, b_, stride, padding, "HW"), x, w, b)

    def relu(self, x: Any) -> Any:
        return self._op(jax.nn.relu, x)

    def avg_pool2d(self, x: Any, kernel: int, stride: int | None = None, padding: int = 0) -> Any:
        s = stride or kernel

        def pool(a: Any) -> Any:
            pads = ((0, 0), (0, 0), (padding, padding), (padding, padding))
            total = lax.reduce_window(a, 0.0, lax.add, (1, 1, kernel, kernel), (1, 1, s, s), pads)
            rows = pool_divisor(a.shape[2], kernel, s, padding, False, True)
            cols = pool_divisor(a.shape[3], kernel, s, padding, False, True)
            return total / np.outer(rows, cols).astype(a.dtype)

        return self._op(pool, x)

    def max_pool2d(self, x: Any, kernel: int, stride: int | None = None, padding: int = 0) -> Any:
        s = stride or kernel
        pads = ((0, 0), (0, 0), (padding, padding), (padding, padding))
        window, strides = (1, 1, kernel, kernel), (1, 1, s, s)
        return self._op(lambda a: lax.reduce_window(a, -np.inf, lax.max, window, strides, pads), x)

    def flatten(self, x: Any) -> Any:
        return self._op(lambda a: a.reshape(a.shape[0], -1), x)

    def matmul(self, a: Any, b: Any) -> Any:
        return self._op(lambda a_, b_: linear(a_, b_.T, None), a, b)

    def add(self, a: Any, b: Any) -> Any:
        return self._op(lambda a_, b_: a_ + b_, a, b)
