"""Tensors with a small reverse-mode autodiff: the numpy backend's native objects.

A :class:`Tensor` holds a numpy array and the emulated device it lives on. A leaf that
records gradients (a parameter) owns ``grad``, an array of its shape, zero until a
backward pass accumulates into it in place (so a gradient handed out as a tensor stays
an alias of it). An operation on tensors that record gradients, while recording is on
(PyTorch's grad mode: on unless inside :func:`no_grad`), returns a tensor that remembers
its inputs and how to map its gradient to theirs; :func:`backward` walks that graph
once, in reverse topological order, and frees it as PyTorch does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from polytrain.errors import BackendError

Grads = tuple[np.ndarray | None, ...]
Vjp = Callable[[np.ndarray], Grads]


@dataclass(frozen=True)
class NumpyDevice:
    """An emulated device: ``cpu`` (index None) or ``cpu:K``; every one is host memory."""

    index: int | None = None

    def __str__(self) -> str:
        return "cpu" if self.index is None else f"cpu:{self.index}"


CPU = NumpyDevice()

_mode = threading.local()


def grad_enabled() -> bool:
    """Whether operations record the graph now (PyTorch's grad mode)."""
    return getattr(_mode, "enabled", True)


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Operations inside record no graph."""
    before = grad_enabled()
    _mode.enabled = False
    try:
        yield
    finally:
        _mode.enabled = before


def _freed(_grad: np.ndarray) -> Grads:
    raise BackendError(
        "backward() went through this graph a second time, but it was freed after the "
        "first pass: compute the loss again (one backward per forward, as in PyTorch)."
    )


class Tensor:
    """An array on an emulated device, with what backward needs when it was recorded."""

    __array_priority__ = 1000  # ``ndarray * tensor`` defers to Tensor.__rmul__

    def __init__(
        self, data: np.ndarray, device: NumpyDevice = CPU, requires_grad: bool = False
    ) -> None:
        self.data = data
        self.device = device
        self.requires_grad = requires_grad
        self.grad: np.ndarray | None = None
        self.parents: tuple[Tensor, ...] = ()
        self.vjp: Vjp | None = None  # None: a leaf

    @classmethod
    def leaf(cls, data: np.ndarray, device: NumpyDevice = CPU) -> Tensor:
        """A tensor that records gradients, with a zero gradient at once."""
        t = cls(data, device, requires_grad=True)
        t.grad = np.zeros_like(data)
        return t

    # -- what it looks like ---------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return int(self.data.ndim)

    def __len__(self) -> int:
        return len(self.data)

    def __array__(self, dtype: Any = None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)

    def item(self) -> float | int:
        return self.data.item()

    def __float__(self) -> float:
        return float(self.data)

    def __int__(self) -> int:
        return int(self.data)

    def __repr__(self) -> str:
        graph = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({self.data!r}, device={self.device}{graph})"

    # -- arithmetic (what a loss needs: scaling, sums of losses) ---------------------------

    def __mul__(self, other: Any) -> Tensor:
        return multiply(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Tensor:
        if isinstance(other, Tensor):
            raise BackendError("numpy backend tensors divide by numbers only.")
        return multiply(self, 1.0 / other)

    def __add__(self, other: Any) -> Tensor:
        return add(self, other if isinstance(other, Tensor) else Tensor(np.asarray(other)))

    __radd__ = __add__

    def __neg__(self) -> Tensor:
        return multiply(self, -1.0)

    def __sub__(self, other: Any) -> Tensor:
        return self + (-other if isinstance(other, Tensor) else -np.asarray(other))


def record(
    data: np.ndarray, inputs: Sequence[Tensor], vjp: Vjp, device: NumpyDevice | None = None
) -> Tensor:
    """The result of an operation on ``inputs``: part of the graph when recording is on
    and an input records gradients, else a plain tensor."""
    out = Tensor(data, inputs[0].device if device is None else device)
    if grad_enabled() and any(t.requires_grad for t in inputs):
        out.requires_grad = True
        out.parents = tuple(inputs)
        out.vjp = vjp
    return out


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes broadcasting added to an operand of ``shape``."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def add(a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` with broadcasting."""
    with np.errstate(all="ignore"):
        data = a.data + b.data

    def vjp(g: np.ndarray) -> Grads:
        return unbroadcast(g, a.shape), unbroadcast(g, b.shape)

    return record(data, (a, b), vjp)


def multiply(a: Tensor, factor: Any) -> Tensor:
    """``a`` times a number (or a tensor of the same shape)."""
    if isinstance(factor, Tensor):
        with np.errstate(all="ignore"):
            data = a.data * factor.data

        def vjp_both(g: np.ndarray) -> Grads:
            with np.errstate(all="ignore"):
                return unbroadcast(g * factor.data, a.shape), unbroadcast(g * a.data, factor.shape)

        return record(data, (a, factor), vjp_both)
    scale = float(factor)
    with np.errstate(all="ignore"):
        data = a.data * scale

    def vjp(g: np.ndarray) -> Grads:
        with np.errstate(all="ignore"):
            return (g * scale,)

    return record(data, (a,), vjp)


def _graph_order(root: Tensor) -> list[Tensor]:
    """Recorded tensors reachable from ``root``, each after every tensor that uses it."""
    order: list[Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for parent in node.parents:
            if parent.requires_grad and id(parent) not in seen:
                stack.append((parent, False))
    order.reverse()
    return order


def backward(root: Tensor, grad: np.ndarray | None = None) -> None:
    """Accumulate d(root)/d(leaf) into every leaf's ``grad`` (root: a scalar unless
    ``grad`` is given), then free the graph."""
    if not root.requires_grad:
        raise BackendError(
            "backward() on a value that depends on no parameter: compute the loss from a "
            "forward pass with train=True, outside no_grad()."
        )
    if grad is None:
        if root.data.size != 1:
            raise BackendError(f"backward() needs a scalar loss, got shape {root.shape}.")
        grad = np.ones_like(root.data)
    pending: dict[int, np.ndarray] = {id(root): grad}
    with np.errstate(all="ignore"):
        for node in _graph_order(root):
            g = pending.pop(id(node), None)
            if g is None:
                continue
            if node.vjp is None:  # a leaf: accumulate in place (keeps aliases valid)
                if node.grad is None:
                    node.grad = np.zeros_like(node.data)
                node.grad += g.reshape(node.grad.shape)
                continue
            for parent, pg in zip(node.parents, node.vjp(g), strict=True):
                if pg is None or not parent.requires_grad:
                    continue
                key = id(parent)
                pending[key] = pg if key not in pending else pending[key] + pg
            node.vjp, node.parents = _freed, ()
