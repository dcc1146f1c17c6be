"""Mixed precision verbs: a capability (:mod:`polytrain.backend.discovery`); a backend
without it trains in fp32 only. The policy is :mod:`polytrain.training.mixed_precision`,
the precisions and the loss scaler :mod:`polytrain.backend.precision`."""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from polytrain.backend.devices import Device
from polytrain.backend.discovery import Capability
from polytrain.backend.model import Model
from polytrain.backend.precision import PrecisionSupport
from polytrain.errors import BackendError


class Precision(Capability):
    """Which precisions work where, autocast, and unscaling fp16 gradients."""

    label: ClassVar[str] = "mixed precision"
    marks: ClassVar[tuple[str, ...]] = ("precision_support",)

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

    @abstractmethod
    def precision_support(self, device: Device | None = None) -> dict[str, PrecisionSupport]:
        """Per precision, whether training works on ``device`` (default: GPU 0, else the
        CPU) and why not; answered without training, for errors and ``polytrain doctor``."""

    def supported_precisions(self, device: Device | None = None) -> list[str]:
        """The precisions :meth:`precision_support` says work on ``device``."""
        return [p for p, s in self.precision_support(device).items() if s.supported]


def fp32_only(name: str) -> dict[str, PrecisionSupport]:
    """What a backend without :class:`Precision` supports: fp32."""
    why = f"the {name} backend implements no mixed precision"
    return {
        "fp32": PrecisionSupport("fp32", True),
        "bf16": PrecisionSupport("bf16", False, why),
        "fp16": PrecisionSupport("fp16", False, why),
        "fp64": PrecisionSupport("fp64", False, f"the {name} backend has no float64"),
    }


def precision_support(backend: Any, device: Device | None = None) -> dict[str, PrecisionSupport]:
    """:meth:`Precision.precision_support` of ``backend`` (a Backend), or fp32 only."""
    if isinstance(backend, Precision):
        return backend.precision_support(device)
    return fp32_only(backend.name)


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
