"""Devices and tensors: neutral device names, their parsing, and the verbs that place data.

Tensors and devices are the framework's own objects; the core never looks inside them.
Names of devices are neutral: ``cpu``, ``cpu:K`` (an emulated device, so data-parallel
logic runs without GPUs) and ``gpu:K``.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from polytrain.backend.identity import IdentityVerbs
from polytrain.distributed.cluster import ClusterInfo
from polytrain.errors import BackendError, ConfigError
from polytrain.neutral.sharding import shard_bounds

Tensor = Any
Device = Any
DeviceSeq = Sequence[Device]
DEVICE_KINDS = ("cpu", "gpu")


class DeviceVerbs(IdentityVerbs):
    """Which devices exist, their neutral names, and tensors placed on them."""

    @abstractmethod
    def gpu_count(self) -> int:
        """Number of GPUs the framework can use here (0 on a CPU build)."""

    @abstractmethod
    def device(self, name: str) -> Device:
        """The native device for a neutral name: ``cpu``, ``cpu:K`` or ``gpu:K``."""

    @abstractmethod
    def device_name(self, device: Device) -> str:
        """The neutral name of a native device."""

    def devices(
        self, spec: str | Sequence[str] = "cpu", *, cluster: ClusterInfo | None = None
    ) -> list[Device]:
        """Devices from a spec: ``cpu``, ``cpu:4`` (four emulated devices), ``gpu``
        (all GPUs, or the CPU if none; with several processes on this node, this
        process's GPU: see :func:`parse_devices`), ``gpu:all``, ``gpu:0,1`` or a list of
        neutral names."""
        names = parse_devices(spec, self.gpu_count(), cluster=cluster)
        return [self.device(n) for n in names]

    def try_gpu(self, i: int = 0) -> Device:
        """GPU ``i`` if it exists, else the CPU."""
        return self.device(f"gpu:{i}") if i < self.gpu_count() else self.device("cpu")

    def try_all_gpus(self) -> list[Device]:
        """Every GPU, or ``[cpu]`` when there is none: never empty."""
        n = self.gpu_count()
        return [self.device(f"gpu:{i}") for i in range(n)] or [self.device("cpu")]

    @abstractmethod
    def to_tensor(self, array: np.ndarray, device: Device | None = None) -> Tensor:
        """A native tensor holding a copy of ``array`` (same dtype) on ``device``."""

    @abstractmethod
    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """A host numpy copy of a native tensor (waits for it on asynchronous engines)."""

    def split_and_load(self, batch: np.ndarray, devices: Sequence[Device]) -> list[Tensor]:
        """One contiguous shard per device, placed there; sizes differ by at most one,
        larger first; nothing is dropped; fewer samples than devices is an error. A
        writeable C-ordered batch (the loader's fresh one) goes through
        :meth:`load_shard`, which may share its memory: the model only reads its inputs;
        any other batch is copied (:meth:`to_tensor`)."""
        bounds = shard_bounds(len(batch), len(devices))
        may_share = batch.flags.c_contiguous and batch.flags.writeable
        tensors = []
        for (a, b), device in zip(bounds, devices, strict=True):
            shard = batch[a:b]
            shared = self.load_shard(shard, device) if may_share else None
            tensors.append(self.to_tensor(shard, device) if shared is None else shared)
        return tensors

    def load_shard(self, shard: np.ndarray, device: Device) -> Tensor | None:
        """``shard`` (of a writeable C-ordered batch) on ``device`` without a host copy,
        sharing its memory where ``device`` is the host; None (the default): copy it with
        :meth:`to_tensor`. Optional: a backend overrides it to save the copy."""
        return None

    def copy_to(self, tensor: Tensor, device: Device) -> Tensor:
        """``tensor`` on ``device``, differentiable: in backward its gradient flows back
        to the source device (pipeline stages hand activations over with it). Optional."""
        raise BackendError(f"Backend {self.name!r} cannot move tensors between devices.")


def split_device_name(name: str) -> tuple[str, int | None]:
    """``("cpu", None)`` for ``cpu``, ``("cpu", 2)`` for ``cpu:2``, ``("gpu", 0)`` for
    ``gpu:0``: what a backend's :meth:`DeviceVerbs.device` maps to a native device."""
    kind, _, index = name.partition(":")
    if kind not in DEVICE_KINDS or not (index == "" or index.isdigit()):
        raise BackendError(f"Unknown device name {name!r}; use cpu, cpu:K or gpu:K.")
    return kind, int(index) if index else None


def device_label(kind: str, index: int | None) -> str:
    """The neutral name of device ``index`` of ``kind`` (``cpu`` when there is no index)."""
    return kind if index is None else f"{kind}:{index}"


def parse_devices(
    spec: str | Sequence[str],
    gpu_count: int,
    *,
    cluster: ClusterInfo | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Neutral device names from a spec (see :meth:`DeviceVerbs.devices`).

    ``gpu`` means every GPU when this process is alone on its node, and this process's
    GPU, ``gpu:<local rank>``, when ``cluster`` puts several processes on the node
    (:func:`process_gpu`). ``gpu:all`` is every GPU in either case; ``gpu:0,1`` and
    ``cpu:N`` mean what they say in every process. ``env`` (default os.environ) is read
    only to name ``CUDA_VISIBLE_DEVICES`` in an error."""
    if not isinstance(spec, str):
        names = [str(s) for s in spec]
        if not names:
            raise ConfigError("An empty device list: give at least one device, e.g. 'cpu'.")
        return names
    text = spec.strip().lower()
    if not text:
        raise ConfigError("An empty device spec: give at least one device, e.g. 'cpu'.")
    if text == "cpu":
        return ["cpu"]
    if text == "gpu" and cluster is not None and cluster.local_world_size > 1 and gpu_count:
        return [process_gpu(cluster, gpu_count, env)]
    if text == "gpu" or text == "gpu:all":
        return [f"gpu:{i}" for i in range(gpu_count)] or ["cpu"]
    kind, _, rest = text.partition(":")
    if kind not in DEVICE_KINDS or not rest:
        raise ConfigError(
            f"Bad device spec {spec!r}. Use 'cpu', 'cpu:N' (N emulated CPU devices), "
            "'gpu' (all GPUs) or 'gpu:0,1'."
        )
    if kind == "cpu":
        if not rest.isdigit() or int(rest) < 1:
            raise ConfigError(f"Bad device spec {spec!r}: 'cpu:N' needs N >= 1.")
        n = int(rest)
        return ["cpu"] if n == 1 else [f"cpu:{i}" for i in range(n)]
    ids = [s.strip() for s in rest.split(",")]
    if not all(s.isdigit() for s in ids):
        raise ConfigError(f"Bad device spec {spec!r}: GPU ids must be integers, as in 'gpu:0,1'.")
    missing = [int(s) for s in ids if int(s) >= gpu_count]
    if missing:
        raise ConfigError(
            f"Device spec {spec!r} asks for GPU {missing[0]}, but {gpu_count} GPU(s) are "
            "available here. Use 'cpu:N' to emulate devices, or 'gpu' for what exists."
        )
    return [f"gpu:{s}" for s in ids]


def process_gpu(cluster: ClusterInfo, gpu_count: int, env: Mapping[str, str] | None = None) -> str:
    """The GPU of this process when several share a node: ``gpu:<local rank>`` (torchrun's
    ``cuda:LOCAL_RANK``), or one line naming the rank, the GPUs and CUDA_VISIBLE_DEVICES."""
    if cluster.local_rank < gpu_count:
        return f"gpu:{cluster.local_rank}"
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    raise ConfigError(
        f"Local rank {cluster.local_rank} (rank {cluster.rank}, {cluster.local_world_size} "
        f"processes on this node) has no GPU: --devices gpu gives each process the GPU of its "
        f"local rank, but {gpu_count} GPU(s) are visible (CUDA_VISIBLE_DEVICES {shown}). "
        "Start at most one process per GPU, or give --devices gpu:0 when each process sees "
        "only its own GPU or the processes are meant to share GPU 0."
    )
