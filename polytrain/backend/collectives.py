"""Collectives: reductions over the replicas of one process and over the processes of a job."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np

from polytrain.backend.devices import Device, DeviceVerbs, Tensor
from polytrain.distributed.cluster import ClusterInfo
from polytrain.errors import BackendError

REDUCE_OPS = ("sum", "mean")


def check_reduce_op(op: str) -> str:
    """``op`` if :meth:`CollectiveVerbs.allreduce` knows it, else a BackendError."""
    if op not in REDUCE_OPS:
        raise BackendError(f"allreduce op must be 'sum' or 'mean', got {op!r}.")
    return op


class CollectiveVerbs(DeviceVerbs):
    """Reductions across devices and, once :meth:`init_distributed` ran, processes."""

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
        tensor = self.to_tensor(np.asarray(values, dtype=np.float64), self.device("cpu"))
        (total,) = self.all_reduced([tensor], "sum")
        return [float(v) for v in self.to_numpy(total)]
