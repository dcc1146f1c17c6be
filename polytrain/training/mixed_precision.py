"""The precision policy of one run, over the backend verbs (autocast, unscaling) and the
framework-free :class:`~polytrain.backend.precision.LossScaler`."""

from __future__ import annotations

import contextlib
from typing import Any

from polytrain.backend.base import Backend, Device, Model
from polytrain.backend.precision import SCALED, LossScaler, PrecisionSupport, check_precision
from polytrain.backend.precision_verbs import Precision, precision_support
from polytrain.errors import BackendError


class MixedPrecision:
    """The precision policy of one model: autocast for forward passes, the loss scale
    for backward, unscaling and the skip decision before the update. Built once per
    run; an unsupported precision is a :class:`BackendError` here, before training (a
    backend without the :class:`Precision` capability supports fp32 only)."""

    def __init__(self, backend: Backend, precision: str, devices: list[Device]) -> None:
        self.backend = backend
        self.precision = check_precision(precision)
        self.scaler: LossScaler | None = None
        self._precision: Precision | None = None
        if precision == "fp32":
            return
        unknown = PrecisionSupport(precision, False, f"the backend does not report {precision}")
        for support in {precision_support(backend, d).get(precision, unknown) for d in devices}:
            if not support.supported:
                where = ", ".join(backend.device_name(d) for d in devices)
                raise BackendError(
                    f"Backend {backend.name!r} cannot train in {precision} on {where}: "
                    f"{support.detail.rstrip('.!')}. Use --precision fp32 here "
                    "(`polytrain doctor` lists what works)."
                )
        self._precision = Precision.required(backend, f"--precision {precision}")
        if precision in SCALED:
            self.scaler = LossScaler()

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Context for forward passes (training and evaluation alike)."""
        if self._precision is None or self.precision == "fp64":  # the model is float64
            return contextlib.nullcontext()
        return self._precision.autocast(self.precision)

    @property
    def loss_scale(self) -> float:
        return 1.0 if self.scaler is None else self.scaler.scale

    def unscale(self, model: Model) -> bool:
        """After gradients are synchronised: divide them by the loss scale and update the
        scaler. False means a gradient was inf/nan and the update must be skipped (every
        process sees the same summed gradients, so every process skips together)."""
        if self.scaler is None or self._precision is None:
            return True
        finite = self._precision.unscale_gradients(model, 1.0 / self.scaler.scale)
        self.scaler.update(finite)
        return finite

    def step_extra(self, skipped: bool) -> dict[str, Any]:
        """What a step record adds under fp16 (the scale; whether the step was skipped)."""
        if self.scaler is None:
            return {}
        return {"loss_scale": self.scaler.scale, "skipped": skipped}

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint stores (None when there is no scaler)."""
        if self.scaler is None:
            return None
        return {"precision": self.precision, **self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore a checkpoint's scaler; a checkpoint without one (another precision)
        leaves the fresh scaler as it is."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
