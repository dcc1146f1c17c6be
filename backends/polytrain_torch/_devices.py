"""Devices on PyTorch: ``cpu:K`` is an emulated device, a replica in host memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from polytrain.backend.devices import device_label, split_device_name


def native_device(name: str) -> torch.device:
    """The torch device of a neutral name (``gpu:K`` is ``cuda:K``)."""
    kind, index = split_device_name(name)
    if kind == "cpu":
        return torch.device("cpu", index) if index is not None else torch.device("cpu")
    return torch.device("cuda", index or 0)


def neutral_name(device: Any) -> str:
    dev = torch.device(device)
    return device_label("gpu" if dev.type == "cuda" else dev.type, dev.index)


def on_distinct_gpus(tensors: Sequence[torch.Tensor]) -> bool:
    """One tensor per GPU: torch.cuda.comm's reduce/broadcast apply (NCCL when present)."""
    devices = [t.device for t in tensors]
    return all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices)


def process_gpu_index(devices: Sequence[Any]) -> int | None:
    """The index of the first GPU among a process's devices, or None when it has none."""
    gpus = [torch.device(d) for d in devices if torch.device(d).type == "cuda"]
    return None if not gpus else gpus[0].index or 0


def set_current_device(devices: Sequence[Any]) -> None:
    """Make the process's first GPU torch's current device (a no-op on the CPU), so
    that NCCL, created next, binds to it and not to GPU 0."""
    index = process_gpu_index(devices)
    if index is not None:
        torch.cuda.set_device(index)


def exact_float32() -> None:
    """Turn off TF32 for convolutions and matmuls on CUDA: cuDNN uses it by default, and
    its 10-bit mantissa moves fp32 results by ~1e-3, past every parity tolerance. The
    fast reduced-precision path is ``precision="bf16"``, which says so."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
