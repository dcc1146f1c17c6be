"""The common interface every backend implements: one docstring per verb states its contract.

:class:`Backend` is the required core, which every backend implements; its required verbs
are abstract, so a third-party backend missing one fails when it is built, not in the
middle of training. Its optional hooks (the step verb, named losses, clipping) have
concrete defaults written with the required verbs; a backend overrides them only to go
faster or to do more. The core is four small ABCs, one per module:

=======================  ==============================================================
``identity``             name, framework, version, threads, seeds, synchronize
``devices``              devices and their neutral names, tensors, split_and_load, copy_to
``model``                build_model, parameters, forward, make_optimizer
``autodiff``             record, losses, backward, gradients, clipping
                         (the step verb ``loss_and_gradients``: here, built from them)
=======================  ==============================================================

What a backend may lack is a *capability*: an ABC of its own, not a base of
:class:`Backend`, which a backend class lists beside it when it has it (the core finds it
with ``isinstance``: :mod:`polytrain.backend.discovery`):

=======================  ==============================================================
:class:`Collectives`     allreduce, broadcast, process groups, the gradient sum
:class:`Precision`       precision_support, autocast, unscale_gradients
:class:`NativeIO`        save_native, load_native
:class:`Inspection`      layer_outputs
:class:`Compilation`     compiled_mode, compile_profile, compile_cache_warm
=======================  ==============================================================

Backend authors share helpers in this package: :func:`~polytrain.backend.model.build_inputs`
(the start of ``build_model``), :func:`~polytrain.backend.devices.split_device_name`,
:func:`~polytrain.backend.collectives.check_reduce_op`,
:func:`~polytrain.backend.mismatch.check_params`, :mod:`polytrain.backend.capture`
(``layer_outputs``), :class:`~polytrain.backend.optimizers.PerReplicaOptimizer` and
:func:`~polytrain.backend.factory.backend_factory` (the plugin's factory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from polytrain.backend.autodiff import AutodiffVerbs, ShardStep
from polytrain.backend.collectives import Collectives as Collectives
from polytrain.backend.compilation import Compilation as Compilation
from polytrain.backend.devices import Device as Device
from polytrain.backend.devices import Tensor as Tensor
from polytrain.backend.devices import parse_devices as parse_devices
from polytrain.backend.discovery import Capability, adopt_capabilities
from polytrain.backend.functional import FunctionalOps
from polytrain.backend.identity import BackendOptions as BackendOptions
from polytrain.backend.inspection import Inspection as Inspection
from polytrain.backend.mismatch import check_params as check_params
from polytrain.backend.model import Model as Model
from polytrain.backend.native_io import NativeIO as NativeIO
from polytrain.backend.precision_verbs import Precision as Precision
from polytrain.errors import BackendError
from polytrain.neutral.losses import LossSpec

#: every capability a backend may have, in the order the docs list them
CAPABILITIES: tuple[type[Capability], ...] = (
    Collectives,
    Precision,
    NativeIO,
    Inspection,
    Compilation,
)


class Backend(AutodiffVerbs):
    """One framework behind the common interface: the required core. A backend lists the
    capabilities it has beside it (``class Mine(Backend, Collectives, NativeIO)``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        adopt_capabilities(cls, CAPABILITIES)  # a backend written as one class keeps them

    def loss(
        self, outputs: Tensor, targets: Tensor, loss: LossSpec, reduction: str = "sum"
    ) -> Tensor:
        """The named loss of :mod:`polytrain.neutral.losses` ("sum", "mean" or "none"; per
        sample, the mean over its output elements), differentiable w.r.t. ``outputs``: its
        value and gradient match ``loss_reference``/``loss_grad_reference``. Float targets
        are cast to the outputs' dtype. The default serves plain cross-entropy through the
        ``cross_entropy`` verb; a backend overrides it for the other losses."""
        if loss.plain:
            return self.cross_entropy(outputs, targets, reduction)
        raise BackendError(
            f"backend {self.name} has no loss {loss.name!r} (with these options): override "
            "Backend.loss, or use a built-in backend."
        )

    def loss_and_gradients(
        self,
        model: Model,
        xs: Sequence[Tensor],
        ys: Sequence[Tensor],
        *,
        loss: LossSpec,
        denominator: int,
        loss_scale: float = 1.0,
        count_correct: bool = False,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> list[ShardStep]:
        """The step verb: shard ``xs[i]`` (targets ``ys[i]``) through replica ``i`` in
        training mode, its loss summed, and the gradients of ``loss * loss_scale /
        denominator`` added to replica ``i``'s; one call per micro-batch, as one function
        of the parameters (forward + loss + gradients). Forward passes run in replica
        order under ``autocast()`` (dropout masks are drawn in that order). With
        ``count_correct`` each shard's arg-max hits are counted (class rows), else its
        ``outputs`` are returned for a metric computed on the host.

        The default is built from the imperative verbs (:meth:`record`, :meth:`forward`,
        :meth:`loss`, :meth:`scale_loss`, :meth:`backward`); a functional framework
        overrides it with one compiled function (JAX: ``jax.value_and_grad``)."""
        steps = []
        with self.record(), autocast():
            for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
                outputs = self.forward(model, x, replica=i, train=True)
                value = self.loss(outputs, y, loss, "sum")
                correct = self.count_correct(outputs, y) if count_correct else None
                steps.append(ShardStep(value, outputs, correct))
        for step in steps:
            self.backward(self.scale_loss(step.loss, denominator, loss_scale))
        return steps

    def functional(self) -> FunctionalOps:
        """Tensor ops for hand-written models (d2l's scratch recipes), in PyTorch's
        semantics: see :mod:`polytrain.backend.functional`. Optional for third-party backends."""
        raise BackendError(
            f"backend {self.name} has no functional ops: implement Backend.functional() "
            "returning a polytrain.backend.functional.FunctionalOps, or use a built-in backend."
        )
