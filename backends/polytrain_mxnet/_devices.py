"""Devices on MXNet: real contexts; ``cpu:K`` is ``mx.cpu(K)``, sharing the host memory."""

from __future__ import annotations

from typing import Any

import mxnet as mx

from polytrain.backend.devices import device_label, split_device_name


def native_device(name: str) -> mx.Context:
    """The context of a neutral name (``cpu`` is ``cpu(0)``)."""
    kind, index = split_device_name(name)
    return mx.cpu(index or 0) if kind == "cpu" else mx.gpu(index or 0)


def neutral_name(device: Any) -> str:
    """Always with the index: contexts have one (``cpu:0``)."""
    return device_label("gpu" if device.device_type == "gpu" else "cpu", device.device_id)
