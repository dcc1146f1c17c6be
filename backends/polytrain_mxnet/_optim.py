"""polytrain's canonical update rules written out with mx.nd ops.

MXNet's own optimizers differ from PyTorch's: SGD puts the learning rate inside the
momentum buffer (diverges once lr changes) and Adam folds the bias correction into lr,
which also rescales eps. So every rule of :mod:`polytrain.neutral.optim` is applied here, in
place, on every context's copy of every parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd

from polytrain.backend.base import Model
from polytrain.neutral.optim import STATE_SLOTS, Optimizer, OptimizerConfig

from ._model import MXNetModel


class MXNetOptimizer(Optimizer):
    """Canonical rules on each context; identical gradients keep the copies identical.

    In one process (``world_size()`` 1) a parameter that no backward since the last zeroing
    reached on any context is not stepped, as torch steps no parameter whose gradient is
    None (Gluon's Trainer with ``ignore_stale_grad`` skips it too): its weights, buffers
    and Adam step count stay. Across processes every parameter is stepped, a missing
    gradient counting as zeros, as on every backend."""

    def __init__(
        self, model: Model, config: OptimizerConfig, world_size: Callable[[], int] = lambda: 1
    ) -> None:
        super().__init__(config)
        self.model = model
        self._world_size = world_size
        own = MXNetModel.of(model)
        self.params = [(n, own.params[n]) for n in own.trainable]
        # per parameter, per context: slot name -> NDArray (created at the first step)
        self.state: dict[str, list[dict[str, Any]]] = {
            n: [{} for _ in model.devices] for n, _ in self.params
        }
        self._all_params = model.native.collect_params()  # walks the block tree: once
        # the (arrays, gradients) marked grad_req 'write' by zero_grad_for_one_backward
        self._written: tuple[list[Any], list[Any]] | None = None
        self._steps: dict[str, int] = {}  # per parameter: updates so far (Adam's t, as torch)

    def step(self) -> None:
        self.step_count += 1
        params = self._reached()
        # the fused kernel takes lr and wd as float32 attributes (0.1 -> 0.10000000149): in
        # float64 (--precision fp64) that is a 1.6e-9 error per step, so float64 models
        # take the element-wise path, whose Python-float scalars stay float64
        if self.config.name in ("sgd", "momentum") and self.model.dtype == "float32":
            self._fused_sgd(params)
            return
        for name, p in params:
            decay = self.config.decay_for(name)
            t = self._steps[name] = self._steps.get(name, 0) + 1
            for ctx, slots in zip(self.model.devices, self.state[name], strict=True):
                w, g = p.data(ctx), p.grad(ctx)
                if decay:
                    g = g + decay * w  # L2, added to the gradient as in torch
                self._update(w, g, slots, t)

    def _reached(self) -> list[tuple[str, Any]]:
        """The parameters this step updates (the class docstring): MXNet flags each array
        whose gradient a backward wrote (``_fresh_grad``); the zeroing clears the flags."""
        if self._world_size() > 1:
            return self.params
        return [(n, p) for n, p in self.params if any(d._fresh_grad for d in p.list_data())]

    def _update(self, w: Any, g: Any, slots: dict[str, Any], t: int) -> None:
        cfg, lr = self.config, self.lr  # sgd and momentum in float32: _fused_sgd
        if cfg.name == "sgd":
            w -= lr * g
        elif cfg.name == "momentum":
            buf = slots.get("momentum_buffer")
            if buf is None:
                buf = slots["momentum_buffer"] = g.copy()
            else:
                buf[:] = cfg.momentum * buf + g
            w -= lr * buf
        elif cfg.name == "adagrad":
            total = slots.setdefault("sum", mx.nd.zeros_like(w))
            total += g * g
            w -= lr * g / (mx.nd.sqrt(total) + cfg.epsilon)  # eps outside the sqrt
        else:
            b1, b2 = cfg.betas
            m = slots.setdefault("exp_avg", mx.nd.zeros_like(w))
            v = slots.setdefault("exp_avg_sq", mx.nd.zeros_like(w))
            m[:] = b1 * m + (1 - b1) * g
            v[:] = b2 * v + (1 - b2) * g * g
            denom = mx.nd.sqrt(v) / math.sqrt(1 - b2**t) + cfg.epsilon
            w -= (lr / (1 - b1**t)) * m / denom

    def _fused_sgd(self, params: list[tuple[str, Any]]) -> None:
        """sgd and momentum with MXNet's fused sgd_update kernel, keeping torch's rule and
        buffer exactly: ``buf - (-1) * (g + (m - 1) * buf)`` is ``m * buf + g``, then
        ``w - lr * (buf + 0 * w)``. Two single-pass kernels per parameter instead of five
        element-wise ops (~0.5 ms of a 2-core LeNet step; Gluon's own sgd_mom_update keeps
        lr inside the buffer, which is not the canonical rule once lr changes)."""
        cfg, lr = self.config, self.lr
        for name, p in params:
            decay = cfg.decay_for(name)
            for ctx, slots in zip(self.model.devices, self.state[name], strict=True):
                w, g = p.data(ctx), p.grad(ctx)
                if decay:
                    g = g + decay * w  # L2, added to the gradient as in torch
                if cfg.name == "momentum":
                    if "momentum_buffer" not in slots:
                        slots["momentum_buffer"] = mx.nd.zeros_like(w)  # m * 0 + g is g
                    buf = slots["momentum_buffer"]
                    mx.nd.sgd_update(buf, g, lr=-1.0, wd=cfg.momentum - 1.0, out=buf)
                    g = buf
                mx.nd.sgd_update(w, g, lr=lr, wd=0.0, out=w)

    def zero_grad(self) -> None:
        if self._written is not None:  # back to grad_req 'add' (set at build_model)
            datas, grads = self._written
            autograd.mark_variables(datas, grads, "add")
            self._written = None
        self._all_params.zero_grad()
        for _, p in self.params:
            for d in p.list_data():
                d._fresh_grad = False  # backward sets it where it wrote the gradient

    def zero_grad_for_one_backward(self) -> None:
        """grad_req 'write' for the step's one backward per context: no zeroing pass, and
        no add into the gradient in every layer's backward (docs/performance.md, "MXNet's
        gradients"). The variables are marked again only when their arrays changed."""
        datas, grads = self._pairs()
        written = self._written
        if written is None or not _same(written[0], datas) or not _same(written[1], grads):
            autograd.mark_variables(datas, grads, "write")
            self._written = (datas, grads)
        for d in datas:
            d._fresh_grad = False  # backward sets it where it wrote the gradient

    def gradients_done(self) -> None:
        """Zero the gradients the backward did not reach (under 'write' they keep the
        last step's), as zero_grad and 'add' would have left them."""
        if self._written is None:
            return
        stale = [g for d, g in zip(*self._written, strict=True) if not d._fresh_grad]
        if stale:
            mx.nd.reset_arrays(*stale, num_arrays=len(stale))

    def _pairs(self) -> tuple[list[Any], list[Any]]:
        """Every trainable parameter's arrays and gradients, on every context."""
        datas: list[Any] = []
        grads: list[Any] = []
        for _, p in self.params:
            datas += p.list_data()
            grads += p.list_grad()
        return datas, grads

    def get_slots(self) -> dict[str, dict[str, np.ndarray]]:
        names = STATE_SLOTS[self.config.name]
        return {
            n: {s: a.asnumpy() for s, a in self.state[n][0].items() if s in names}
            for n, _ in self.params
        }

    def set_slots(self, slots: dict[str, dict[str, np.ndarray]]) -> None:
        for name, p in self.params:
            given = slots.get(name, {})
            if given:  # a checkpoint holds one step count, as torch's set_slots reads it
                self._steps[name] = self.step_count
            for ctx, state in zip(self.model.devices, self.state[name], strict=True):
                for slot, value in given.items():
                    state[slot] = mx.nd.array(np.asarray(value), ctx=ctx, dtype=p.dtype)


def _same(old: list[Any], new: list[Any]) -> bool:
    """The same array objects, in order (NDArray's == compares elements)."""
    return len(old) == len(new) and all(a is b for a, b in zip(old, new, strict=True))
