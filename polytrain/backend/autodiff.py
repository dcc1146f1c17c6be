"""Autodiff: losses, backward passes and the gradients they leave on every replica."""

from __future__ import annotations

import contextlib
import functools
import operator
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from polytrain.backend.devices import Tensor
from polytrain.backend.model import Model, ModelVerbs
from polytrain.errors import BackendError

P = TypeVar("P")  # a framework's parameter
G = TypeVar("G")  # its gradient tensor


def gradients_to_sum(
    replicas: Sequence[Sequence[P]],
    world_size: int,
    grad: Callable[[P], G | None],
    zeros: Callable[[P], G],
) -> list[list[G]]:
    """Per parameter (``replicas``: one list of parameters per replica), each replica's
    gradient (``grad``), ready to be summed. In one process a parameter that no replica's
    backward reached is left out: its gradient stays missing and the optimizer skips it,
    as on one device (docs/semantics.md, rule 21). Otherwise a missing gradient (a
    parameter the forward of that replica did not use) is made zeros (``zeros`` sets and
    returns it), as on every other rank: whether another process reached it is not
    known here."""
    out = []
    for params in zip(*replicas, strict=True):
        grads = [grad(p) for p in params]
        if world_size == 1 and all(g is None for g in grads):
            continue
        out.append([zeros(p) if g is None else g for p, g in zip(params, grads, strict=True)])
    return out


@dataclass
class ShardStep:
    """What the step verb :meth:`~polytrain.backend.base.Backend.loss_and_gradients`
    gives per shard, native values: the shard's *summed* loss (unscaled), its outputs,
    and the number of rows whose arg-max is the label when a count was asked for."""

    loss: Tensor
    outputs: Tensor | None
    correct: Tensor | None = None


class AutodiffVerbs(ModelVerbs):
    """Recording, losses, backward, and gradients (summed over replicas by the
    :class:`~polytrain.backend.collectives.Collectives` capability)."""

    def record(self) -> contextlib.AbstractContextManager[None]:
        """Context in which a training forward pass records the graph for backward
        (MXNet's autograd.record). The default does nothing: frameworks that record
        whenever gradients are enabled need no scope."""
        return contextlib.nullcontext()

    @abstractmethod
    def cross_entropy(
        self,
        logits: Tensor,
        labels: Tensor,
        reduction: str = "mean",
        ignore_index: int | None = None,
    ) -> Tensor:
        """Softmax cross-entropy of integer labels shaped [N] or [N, 1] ("mean", "sum" or
        "none"). Samples labelled ``ignore_index`` contribute 0 and "mean" divides by the
        samples kept (PyTorch's rule; Paddle's own divides by all); None ignores nothing."""

    @abstractmethod
    def count_correct(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Number of rows whose arg-max equals the label, as a native scalar."""

    def sum_counts(self, counts: Sequence[Tensor]) -> Tensor:
        """The sum of native scalars on one device, as a native scalar, with no host read:
        the step runner holds each step's accuracy count on the device and sums them just
        before it reads them. Exact for whole counts (a low-precision float count is summed
        in float32 at least). The default adds them one by one; a backend overrides it with
        one op where dispatch is costly."""
        return functools.reduce(operator.add, counts)

    @abstractmethod
    def backward(self, loss: Tensor) -> None:
        """Accumulate d(loss)/d(parameters) into the gradients of the loss's replica."""

    def scale_loss(self, loss: Tensor, denominator: int, scale: float = 1.0) -> Tensor:
        """What to backpropagate for a shard's *summed* loss: divided by the number of
        samples of the global batch (all shards, processes and micro-batches), times the
        loss scale under mixed precision. So every backend's gradient is the gradient
        of the mean loss over the global batch."""
        return loss * (scale / denominator)

    @abstractmethod
    def gradients(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        """Gradients of one replica as numpy, canonical names and layout."""

    @abstractmethod
    def replica_gradients(self, model: Model) -> list[list[Tensor]]:
        """Per trainable parameter, the native gradient tensor of each replica, to be
        summed. In one process a parameter that no replica's backward reached may be left
        out, and is then not stepped (docs/semantics.md, rule 21)."""

    def grad_norm(self, model: Model) -> float:
        """Global L2 norm of replica 0's gradients (after synchronisation)."""
        grads = self.gradients(model)
        return float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))

    def scale_gradients(self, model: Model, factor: float) -> None:
        """Multiply every replica's gradients by ``factor`` in place, computed in the
        gradients' dtype (float64 stays exact to it): clipping by global norm."""
        raise BackendError(
            f"Backend {self.name!r} cannot scale gradients: implement Backend.scale_gradients "
            "to use --clip-grad-norm."
        )

    def clip_gradients(self, model: Model, limit: float) -> None:
        """Clamp every element of every replica's gradients to ``[-limit, limit]`` in place
        (PyTorch's clip_grad_value_), in the gradients' dtype: clipping by value."""
        raise BackendError(
            f"Backend {self.name!r} cannot clip gradients: implement Backend.clip_gradients "
            "to use --clip-grad-value."
        )
