"""Which device the conformance suite runs on: the CPU, or ``$POLYTRAIN_TEST_DEVICE``.

The suite's tests build models without naming devices and ask for emulated ``cpu:K``
replicas; with ``POLYTRAIN_TEST_DEVICE=gpu:0`` the backend under test places all of that
on ``gpu:0`` instead (the ``K`` replicas all on the one device), so the same checks run on
a GPU (``scripts/gpu-check``). The tests of device names themselves still see the CPU's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from polytrain.backend.base import Backend, Device, Model, Tensor

TEST_DEVICE_VAR = "POLYTRAIN_TEST_DEVICE"


def device_under_test() -> str:
    """The neutral device name in ``$POLYTRAIN_TEST_DEVICE`` (default ``cpu``)."""
    return os.environ.get(TEST_DEVICE_VAR, "").strip().lower() or "cpu"


def on_test_device(backend: Backend, name: str | None = None) -> Backend:
    """``backend`` itself on the CPU; for another device (``name``, default
    :func:`device_under_test`) an instance of a subclass that puts every model and tensor
    placed on the CPU (no device, ``cpu`` or ``cpu:K``) on that device instead."""
    name = name or device_under_test()
    if name == "cpu":
        return backend
    target = backend.device(name)

    def moved(device: Device | None) -> Device:
        on_cpu = device is None or backend.device_name(device).startswith("cpu")
        return target if on_cpu else device

    class OnDevice(type(backend)):  # type: ignore[misc]
        def build_model(
            self, model: Any, devices: Sequence[Device] | None = None, *, dtype: str = "float32"
        ) -> Model:
            placed = [moved(d) for d in devices] if devices else [target]
            return super().build_model(model, placed, dtype=dtype)

        def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
            return super().to_tensor(array, moved(device))

    OnDevice.__name__ = f"{type(backend).__name__}On{name.replace(':', '')}"
    return OnDevice(backend.options)
