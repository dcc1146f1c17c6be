"""The training step as one pure function, ``jax.jit``-compiled (``--fast``, the default
the automatic mode picks) or run op by op (``--no-fast``): forward, loss,
``jax.value_and_grad``, the accuracy count, BatchNorm's new statistics and, in a *fused*
step (one replica, one backward, an optimizer made), the optimizer's update too.

The fused update is speculative: :meth:`JaxModel.commit_update` takes it when the
optimizer steps from the very gradients the program returned (nothing clipped, synced or
accumulated in between) at the same learning rate; otherwise the optimizer runs its own
update program on the gradients as they are. A step whose loss is not finite never
steps, so its update is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from polytrain.neutral.losses import LossSpec

from ._losses import count_correct, named_loss
from ._masks import GivenMasks, KeyMasks
from ._net import Apply, Array, Context, State
from ._optim import JaxOptimizer, update


@dataclass(frozen=True)
class StepKind:
    """What one compiled step program computes (its cache key with the model)."""

    loss: LossSpec
    count: bool  # the arg-max count of class rows (else the outputs are returned)
    fused: bool  # the optimizer's update as well


def mask_source(masks: tuple[Array, ...], key: Array, counter: Array) -> Any:
    """Parity masks when given, else masks from the step's key."""
    return GivenMasks(masks) if masks else KeyMasks(jax.random.fold_in(key, counter))


def step_program(
    apply: Apply, kind: StepKind, optimizer: JaxOptimizer | None
) -> Callable[..., dict[str, Any]]:
    """``program(params, buffers, x, y, masks, key, counter, scale, opt)`` -> a dict of
    ``loss`` (summed), ``grads`` (of loss * scale), ``buffers``, and ``correct``,
    ``outputs`` or ``update`` (new params and slots) as ``kind`` asks."""
    config = optimizer.config if optimizer is not None else None
    decay = optimizer.decay if optimizer is not None else {}

    def program(
        params: State, buffers: State, x: Array, y: Array, masks: tuple[Array, ...],
        key: Array, counter: Array, scale: Array, opt: tuple[Any, ...],
    ) -> dict[str, Any]:  # fmt: skip
        def objective(p: State) -> tuple[Array, tuple[Array, Array, State]]:
            ctx = Context(train=True, mask=mask_source(masks, key, counter))
            out = apply(p | buffers, x, ctx)
            total = named_loss(kind.loss, out, y, "sum")
            return total * scale, (total, out, ctx.updates)

        (_, (total, out, updates)), grads = jax.value_and_grad(objective, has_aux=True)(params)
        result: dict[str, Any] = {"loss": total, "grads": grads, "buffers": buffers | updates}
        if kind.count:
            result["correct"] = count_correct(out, y)
        else:
            result["outputs"] = out
        if kind.fused and config is not None:
            slots, scalars = opt
            result["update"] = update(config, decay, params, grads, slots, scalars)
        return result

    return program


def eval_program(apply: Apply) -> Callable[[State, Array], Array]:
    """The eval-mode forward: running statistics, no dropout."""
    return lambda state, x: apply(state, x, Context(train=False))
