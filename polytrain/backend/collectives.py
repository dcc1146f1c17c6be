"""Collectives: reductions over the replicas of one process and over the processes of a job.

A capability (:mod:`polytrain.backend.discovery`): a backend without it trains on one
device in one process.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar, cast

import numpy as np

from polytrain.backend.autodiff import AutodiffVerbs
from polytrain.backend.devices import Device, Tensor
from polytrain.backend.discovery import Capability
from polytrain.backend.model import Model
from polytrain.distributed.cluster import ClusterInfo
from polytrain.errors import BackendError

REDUCE_OPS = ("sum", "mean")


def check_reduce_op(op: str) -> str:
    """``op`` if :meth:`Collectives.allreduce` knows it, else a BackendError."""
    if op not in REDUCE_OPS:
        raise BackendError(f"allreduce op must be 'sum' or 'mean', got {op!r}.")
    return op


class Collectives(Capability):
    """Reductions across devices and, once :meth:`init_distributed` ran, processes; the
    gradient sum of a step (:meth:`sync_gradients`) built on them."""

    label: ClassVar[str] = "collectives"
    marks: ClassVar[tuple[str, ...]] = ("allreduce", "broadcast")

    @abstractmethod
    def allreduce(self, tensors: Sequence[Tensor], op: str) -> None:
        """Reduce in place: afterwards every tensor holds the ``op`` ("sum" or "mean") of
        all of them and stays on its device. When a process group is initialised, the
        reduction also spans every process (the framework's own collective). A framework
        of immutable arrays raises a BackendError here and implements
        :meth:`all_reduced` (its plugin declares the collectives it has:
        :class:`~polytrain.backend.capabilities.Capabilities`)."""

    @abstractmethod
    def broadcast(self, tensors: Sequence[Tensor], src: int = 0) -> None:
        """Copy ``tensors[src]`` into every other tensor in place (and from the rank-0
        process to the others when a process group is initialised)."""

    def all_reduced(self, tensors: Sequence[Tensor], op: str) -> list[Tensor]:
        """The ``op`` ("sum" or "mean") of all ``tensors``, one result on each tensor's
        device (and over every process once a process group is initialised): the
        collective for frameworks whose arrays are immutable. Callers use the returned
        tensors; the default reduces in place with :meth:`allreduce` and returns them."""
        self.allreduce(tensors, op)
        return list(tensors)

    def broadcasted(self, tensors: Sequence[Tensor], src: int = 0) -> list[Tensor]:
        """``tensors[src]`` on every tensor's device, as returned tensors (see
        :meth:`all_reduced`); the default copies in place with :meth:`broadcast`."""
        self.broadcast(tensors, src)
        return list(tensors)

    def init_distributed(
        self, info: ClusterInfo, devices: Sequence[Device], timeout: float = 120.0
    ) -> None:
        """Join the process group of ``info`` through the framework's own engine;
        afterwards :attr:`rank` and :attr:`world_size` are set and :meth:`allreduce`/
        :meth:`broadcast` span every process. ``timeout`` bounds the rendezvous and every
        collective, so a dead peer cannot hang the others."""
        if info.world_size > 1:
            raise BackendError(f"Backend {self.name!r} does not support several processes.")

    def use_process_device(self, devices: Sequence[Device]) -> None:
        """Make the first GPU of ``devices`` the framework's current device, if there is
        one; :meth:`init_distributed` calls it before creating the process group, so that
        the group's GPU collectives bind to this process's GPU. The default does nothing
        (frameworks without a current device)."""

    def shutdown_distributed(self) -> None:
        """Leave the process group (so that no rank aborts at exit)."""

    def allreduce_numbers(self, values: Sequence[float]) -> list[float]:
        """Sum host numbers over every process (float64 on the host; identity alone)."""
        if self.world_size == 1:
            return [float(v) for v in values]
        backend = cast(AutodiffVerbs, self)  # the core verbs of the Backend it is part of
        tensor = backend.to_tensor(np.asarray(values, dtype=np.float64), backend.device("cpu"))
        (total,) = self.all_reduced([tensor], "sum")
        return [float(v) for v in backend.to_numpy(total)]

    def sync_gradients(self, model: Model) -> None:
        """Sum every gradient over replicas (and processes): after it, each replica
        holds the gradient of the whole global batch."""
        if model.num_devices == 1 and self.world_size == 1:
            return
        if self.sync_in_buckets(model):
            return
        for grads in cast(AutodiffVerbs, self).replica_gradients(model):
            self.allreduce(grads, "sum")

    def sync_in_buckets(self, model: Model) -> bool:
        """The fused path of :meth:`sync_gradients`: sum the gradients in flat buckets of
        ``bucket_mb`` (:mod:`polytrain.backend.buckets`) and return True; False (the
        default, and a bucket size of 0) leaves one collective per parameter."""
        return False


def sum_over_processes(backend: AutodiffVerbs, values: Sequence[float]) -> list[float]:
    """:meth:`Collectives.allreduce_numbers` where the backend has collectives; alone
    (one process), the values themselves."""
    if backend.world_size == 1:
        return [float(v) for v in values]
    return Collectives.required(backend, "summing over processes").allreduce_numbers(values)


def leave_processes(backend: AutodiffVerbs) -> None:
    """:meth:`Collectives.shutdown_distributed`, if the backend has collectives (without
    them it never joined a process group)."""
    collectives = Collectives.of(backend)
    if collectives is not None:
        collectives.shutdown_distributed()
