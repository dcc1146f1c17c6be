"""Devices on Paddle: one CPU place per process, so ``cpu:K`` is a replica in host memory
(:class:`HostDevice`); GPUs are CUDA places."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import paddle

from polytrain.backend.devices import device_label, split_device_name
from polytrain.errors import BackendError


@dataclass(frozen=True)
class HostDevice:
    """``cpu`` or the emulated ``cpu:K``: Paddle has one CPU place per process, so K
    only names a replica held in host memory."""

    index: int | None = None


def native_device(name: str) -> Any:
    """The device of a neutral name: a :class:`HostDevice` or a CUDA place."""
    kind, index = split_device_name(name)
    return HostDevice(index) if kind == "cpu" else paddle.CUDAPlace(index or 0)


def neutral_name(device: Any) -> str:
    if isinstance(device, HostDevice):
        return device_label("cpu", device.index)
    if isinstance(device, paddle.CUDAPlace):
        return device_label("gpu", device.get_device_id())  # type: ignore[attr-defined]
    if isinstance(device, paddle.CPUPlace):
        return "cpu"
    raise BackendError(f"Not a paddle device: {device!r}.")


def place(device: Any | None) -> Any:
    """The Paddle place of a device (every host device is the one CPU place)."""
    return paddle.CPUPlace() if device is None or isinstance(device, HostDevice) else device


def moved(tensor: paddle.Tensor, to: Any) -> paddle.Tensor:
    """``tensor`` on place ``to``: itself when it is there already."""
    return tensor if tensor.place == to else tensor.to(to)


def process_gpu_index(devices: Sequence[Any]) -> int | None:
    """The id of the first GPU among a process's devices, or None when it has none."""
    gpus = [d for d in devices if isinstance(d, paddle.CUDAPlace)]
    return None if not gpus else int(gpus[0].get_device_id())  # type: ignore[attr-defined]


def set_current_device(devices: Sequence[Any]) -> None:
    """Make the process's first GPU Paddle's current device (a no-op on the CPU):
    ``init_parallel_env`` takes its GPU from FLAGS_selected_gpus (default 0), so both."""
    index = process_gpu_index(devices)
    if index is not None:
        os.environ["FLAGS_selected_gpus"] = str(index)  # noqa: SIM112 - Paddle's flag
        paddle.set_device(f"gpu:{index}")
