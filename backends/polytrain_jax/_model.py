"""The jax backend's devices, models and the float64 scope.

Arrays are immutable, so a :class:`JaxModel` holds each replica's parameters, buffers and
gradients as dicts of arrays (canonical names) and replaces them; the pure function of the
spec (:func:`._net.build`) runs them.

``jax_enable_x64`` is scoped with ``jax.experimental.enable_x64()`` (:func:`x64`) around
every verb of the backend, never set process-wide: the flag only decides whether JAX keeps
64-bit dtypes (float64 models and tensors, int64 labels) or narrows them to 32 bits, and
polytrain gives every array an explicit dtype, so float32 programs stay float32 under it
(tests/backends/test_jax_backend.py checks a float32 step's program for f64) while a user's own JAX
code in the same process keeps its own setting (the context is thread-local and restored).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import enable_x64

from polytrain.backend.model import Model

from ._net import Apply, State


def x64() -> contextlib.AbstractContextManager[Any]:
    """The scope in which JAX keeps 64-bit dtypes (always entered by the backend's verbs)."""
    return enable_x64(True)


@dataclass(frozen=True)
class JaxDevice:
    """A neutral device name and the XLA device behind it (``cpu:K`` is host device K)."""

    label: str
    device: Any

    def __str__(self) -> str:
        return self.label


@dataclass
class Speculative:
    """The update a fused step computed with its gradients, kept until the optimizer
    steps: committed if those gradients, the learning rate and the step are unchanged."""

    grads: State
    params: State
    slots: Any
    lr: float
    step: int


@dataclass
class JaxModel(Model):
    """Per replica ``params`` (trainable), ``buffers`` (BatchNorm statistics) and ``grads``
    (None: zeroed), all by canonical name; ``apply`` is the spec's pure function."""

    apply: Apply | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    params: list[State] = field(default_factory=list)
    buffers: list[State] = field(default_factory=list)
    grads: list[State | None] = field(default_factory=list)
    programs: dict[Any, Callable[..., Any]] = field(default_factory=dict)  # compiled, by key
    optimizer: Any = None  # the JaxOptimizer made for it (its slots join a fused step)
    one_backward: bool = False  # zeroed for one backward per replica (a fused step may run)
    speculative: Speculative | None = None

    def state(self, replica: int) -> State:
        return self.params[replica] | self.buffers[replica]

    def zero_grads(self, *, one_backward: bool) -> None:
        self.grads = [None] * self.num_devices
        self.one_backward = one_backward
        self.speculative = None

    def add_grads(self, replica: int, grads: State) -> None:
        old = self.grads[replica]
        self.grads[replica] = grads if old is None else jax.tree_util.tree_map(jnp.add, old, grads)

    def commit_update(self, optimizer: Any) -> bool:
        """Take the fused step's update when it was computed from the current gradients."""
        s, self.speculative = self.speculative, None
        if s is None or self.grads[0] is not s.grads:
            return False
        if s.lr != optimizer.lr or s.step != optimizer.step_count + 1:
            return False
        self.params[0], optimizer.slots[0] = s.params, s.slots
        return True
