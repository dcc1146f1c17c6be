"""Mixed precision verbs (optional; the policy is :mod:`polytrain.training.mixed_precision`,
the precisions and the loss scaler :mod:`polytrain.backend.precision`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from polytrain.backend.devices import Device
from polytrain.backend.identity import IdentityVerbs
from polytrain.backend.model import Model
from polytrain.backend.precision import PrecisionSupport
from polytrain.errors import BackendError


class PrecisionVerbs(IdentityVerbs):
    """Autocast, unscaling fp16 gradients, and which precisions work where."""

    @contextlib.contextmanager
    def autocast(self, precision: str) -> Iterator[None]:
        """Run forward passes under ``precision`` ("fp32" needs no support): low-precision
        matmuls and convolutions, float32 losses and parameters."""
        if precision != "fp32":
            raise BackendError(f"Backend {self.name!r} cannot train in {precision} here.")
        yield

    def unscale_gradients(self, model: Model, inv_scale: float) -> bool:
        """Multiply every replica's gradients by ``inv_scale`` in place (undoing the loss
        scale) and return whether all of them are finite. Only fp16 needs it."""
        raise BackendError(f"Backend {self.name!r} cannot unscale gradients (no fp16 support).")

    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        """Per precision, whether training works on ``device`` (default: GPU 0, else the
        CPU) and why not; answered without training, for errors and ``polytrain doctor``."""
        why = f"the {self.name} backend implements no mixed precision"
        return {
            "fp32": PrecisionSupport("fp32", True),
            "bf16": PrecisionSupport("bf16", False, why),
            "fp16": PrecisionSupport("fp16", False, why),
            "fp64": PrecisionSupport("fp64", False, f"the {self.name} backend has no float64"),
        }

    def supported_precisions(self, device: Device | None = None) -> list[str]:
        """The precisions :meth:`precision_support` says work on ``device``."""
        return [p for p, s in self.precision_support(device).items() if s.supported]


def probe_float64(
    framework: str,
    run: Callable[[], tuple[Any, Any]],
    float64: Any,
    reason: Callable[[Exception], str] = str,
) -> PrecisionSupport:
    """Whether fp64 works, measured: ``run()`` computes a float64 convolution and dense
    layer forward and backward and returns the dtypes of the output and of the weight's
    gradient (None without one); both must be ``float64``, the framework's own dtype.
    An exception in ``run`` is the framework's refusal: ``reason(exc)`` says why."""
    try:
        out, grad = run()
    except Exception as exc:
        return PrecisionSupport("fp64", False, f"{framework} float64 failed: {reason(exc)}")
    if out != float64 or grad != float64:
        return PrecisionSupport("fp64", False, f"{framework} computed {out}, not float64")
    return PrecisionSupport("fp64", True, "float64 model (parity mode)")
