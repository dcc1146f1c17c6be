"""Functional ops: the tensor verbs of d2l's "from scratch" recipes, on every backend.

d2l's multi-GPU chapter writes LeNet as a function of a list of parameter tensors and
trains it by hand: copy the parameters to each device, compute each shard's loss there,
sum the gradients over devices, apply SGD on every device. :class:`FunctionalOps` gives
that program the few tensor operations it needs, with PyTorch's semantics on every
framework, so one scratch program runs on all of them::

    ops = backend.functional()
    w = ops.parameter(np_weight, device)              # a leaf that records gradients
    with backend.record():                            # MXNet records only in this scope
        y = ops.relu(ops.conv2d(x, w, b))
        loss = backend.cross_entropy(logits, labels, "sum")
    backend.backward(loss)
    backend.allreduce([ops.grad(w_on_dev) for w_on_dev in copies], "sum")
    ops.sgd_(params, lr, batch_size)

The rest of such a program uses the :class:`~polytrain.backend.base.Backend` verbs
(``to_tensor``, ``split_and_load``, ``allreduce``, ``record``, ``backward``,
``cross_entropy``, ``count_correct``). Each backend implements this class in its
``_ops.py``; :class:`polytrain.testing.functional.FunctionalConformance` checks an
implementation against numpy.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

Tensor = Any
Device = Any


class FunctionalOps(ABC):
    """Stateless tensor operations of one backend (``backend.functional()``).

    Tensors are the framework's own; images are NCHW float32, conv weights OIHW, and
    ``matmul`` multiplies 2-d tensors as they are (a weight in d2l's own [in, out]
    layout is the user's choice, not a canonical parameter).
    """

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    # -- parameters and gradients ---------------------------------------------------------

    @abstractmethod
    def parameter(self, value: Any, device: Device | None = None) -> Tensor:
        """A new leaf tensor on ``device`` (default: the CPU) holding a copy of ``value``
        (a numpy array or a native tensor; never an alias of it) that records gradients.
        Its gradient exists at once, zero, and accumulates over backward calls until
        :meth:`zero_grad` (PyTorch's ``.grad``)."""

    @abstractmethod
    def grad(self, t: Tensor) -> Tensor:
        """The gradient tensor of parameter ``t``, on ``t``'s device. Writing into it in
        place (as ``Backend.allreduce`` does) changes the gradient itself."""

    @abstractmethod
    def zero_grad(self, t: Tensor) -> None:
        """Set the gradient of parameter ``t`` to zero in place."""

    @abstractmethod
    def copy_to(self, t: Tensor, device: Device) -> Tensor:
        """A copy of ``t``'s values on ``device``: always a new tensor (also on the same
        or an emulated device), recording no gradient."""

    @abstractmethod
    def no_grad(self) -> contextlib.AbstractContextManager[Any]:
        """Context in which operations record no gradient (``torch.no_grad``)."""

    @abstractmethod
    def sgd_(self, params: Sequence[Tensor], lr: float, batch_size: int) -> None:
        """d2l's ``sgd``: for every parameter, in place and without recording,
        ``p -= lr * grad(p) / batch_size``, then its gradient is set to zero."""

    # -- layers ---------------------------------------------------------------------------

    @abstractmethod
    def conv2d(
        self, x: Tensor, w: Tensor, b: Tensor | None = None, stride: int = 1, padding: int = 0
    ) -> Tensor:
        """Cross-correlation of NCHW ``x`` with OIHW ``w`` plus bias ``b`` [O] (or none);
        square ``stride`` and zero ``padding`` (``torch.nn.functional.conv2d``)."""

    @abstractmethod
    def relu(self, x: Tensor) -> Tensor:
        """max(x, 0) elementwise."""

    @abstractmethod
    def avg_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        """Average over ``kernel`` x ``kernel`` windows (``stride`` defaults to
        ``kernel``); zero padding counts in the average (torch's ``count_include_pad``,
        not Paddle's default ``exclusive``); output size rounds down."""

    @abstractmethod
    def max_pool2d(
        self, x: Tensor, kernel: int, stride: int | None = None, padding: int = 0
    ) -> Tensor:
        """Maximum over ``kernel`` x ``kernel`` windows (``stride`` defaults to
        ``kernel``); padding never wins the maximum; output size rounds down."""

    @abstractmethod
    def flatten(self, x: Tensor) -> Tensor:
        """``[N, ...]`` -> ``[N, prod(...)]`` (d2l's ``x.reshape(x.shape[0], -1)``)."""

    @abstractmethod
    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """Matrix product of 2-d ``a`` [N, K] and ``b`` [K, M] (``torch.mm``)."""

    @abstractmethod
    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise sum with broadcasting (``h @ W + b`` adds a bias row)."""
