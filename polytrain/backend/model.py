"""Models: what a backend builds (:class:`Model`), the verbs over it, and the shared start
of every ``build_model``.

A backend keeps its own bookkeeping (name maps, layout converters, train/eval state) in
typed fields of a :class:`Model` subclass it defines, and narrows the models it is given
with :meth:`Model.of`, so a model built by another backend is an error, never misread.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Self

import numpy as np

from polytrain.backend.devices import Device, DeviceSeq, DeviceVerbs, Tensor
from polytrain.backend.precision import check_dtype
from polytrain.errors import BackendError
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.optim import Optimizer, OptimizerConfig


@dataclass
class Model:
    """A native model and where it lives; what the recipe loop holds.

    ``replicas[i]`` is the native module used on ``devices[i]`` (on MXNet every entry is
    the same block, whose parameters hold one copy per context). A backend's own
    bookkeeping lives in the fields of its subclass.
    """

    native: Any
    devices: list[Device]
    replicas: list[Any]
    spec: ModelSpec | None = None
    dtype: str = "float32"  # of parameters, activations, gradients and optimizer state

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @classmethod
    def of(cls, model: Model) -> Self:
        """``model`` as this subclass: what a backend's verbs call on the model they get."""
        if not isinstance(model, cls):
            raise BackendError(
                f"This backend keeps its models as {cls.__name__}, but got a "
                f"{type(model).__name__}: build the model with the backend that runs it."
            )
        return model


def build_inputs(
    backend: DeviceVerbs,
    model: ModelSpec | Any,
    devices: DeviceSeq | None,
    dtype: str,
    native: type | tuple[type, ...],
    what: str,
) -> tuple[ModelSpec | None, list[Device]]:
    """The start of every ``build_model``: ``dtype`` checked, the devices (default: the
    CPU) and the spec, or None for a native module of type ``native`` (``what`` names it
    in the error any other object gets)."""
    check_dtype(dtype)
    placed = list(devices) if devices else [backend.device("cpu")]
    if isinstance(model, ModelSpec):
        return model, placed
    if isinstance(model, native):
        return None, placed
    raise BackendError(
        f"{backend.name} backend builds a polytrain ModelSpec or wraps a {what}, "
        f"not {type(model).__name__}."
    )


class ModelVerbs(DeviceVerbs):
    """Building models, their parameters, and running them forward."""

    @abstractmethod
    def build_model(
        self, model: ModelSpec | Any, devices: DeviceSeq | None = None, *, dtype: str = "float32"
    ) -> Model:
        """Build a neutral spec (or wrap a user's own native module) on ``devices``.

        A spec is built with the spec's layer names, so native parameter names follow
        the canonical ones. Weights are whatever the framework chose: call
        :meth:`set_params` with ``spec.init_params(seed)`` for identical starts.
        ``dtype`` (``float32`` or ``float64``) is that of the parameters and buffers,
        hence of the whole computation: ``"float64"`` is ``--precision fp64``, the parity
        mode in which the frameworks' rounding differences stay below any training chaos.
        Inputs are cast to it by the caller (:class:`polytrain.training.step.StepRunner`).
        :func:`build_inputs` is the common start of an implementation."""

    @abstractmethod
    def get_params(self, model: Model, replica: int = 0) -> dict[str, np.ndarray]:
        """All parameters and buffers of replica ``replica`` (default 0) as numpy of the
        model's dtype (float32, or float64 under fp64) in the canonical (PyTorch) layout
        and names: conv OIHW, linear [out, in], BatchNorm weight/bias/running_mean/
        running_var (torch's unbiased running_var)."""

    @abstractmethod
    def set_params(self, model: Model, params: dict[str, np.ndarray]) -> None:
        """Load canonical parameters into every replica, cast to the model's dtype.
        Missing, unexpected or wrongly shaped entries are a
        :class:`~polytrain.errors.CheckpointError` naming them
        (:func:`polytrain.backend.mismatch.check_params`)."""

    @abstractmethod
    def parameter_names(self, model: Model) -> list[str]:
        """Canonical names of the trainable parameters, in model order."""

    @abstractmethod
    def forward(self, model: Model, x: Tensor, *, replica: int = 0, train: bool = False) -> Tensor:
        """Logits of replica ``replica`` for ``x`` (on that replica's device). With
        ``train=False`` the model is in eval mode and no graph is recorded."""

    @abstractmethod
    def make_optimizer(self, model: Model, config: OptimizerConfig) -> Optimizer:
        """An optimizer over every replica applying the update rule of
        :mod:`polytrain.neutral.optim`."""
