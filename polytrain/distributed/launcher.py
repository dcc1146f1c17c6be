"""How ``polytrain launch`` starts processes on one backend's engine, as its plugin
declares it.

A backend plugin registers one :class:`Launcher` through the
``polytrain_register_launchers`` hook. :func:`polytrain.distributed.launch.launch` does
what is common (checks, addresses, the environment) and hands over to the launcher of
the backend named by ``--backend``; the :class:`~polytrain.distributed.cluster.ClusterEnvironment`
it names tells a worker its rank and world from that engine's variables.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from polytrain.distributed.cluster import ClusterEnvironment
    from polytrain.distributed.launch import LaunchSpec


class Launcher(ABC):
    """One backend's way of starting N processes per node."""

    backend: str
    """the backend it launches (``--backend``)"""
    name: str
    """the engine's launcher, for messages (``torchrun``)"""
    environment: type[ClusterEnvironment] | None = None
    """how a worker reads this launcher's variables (None: it sets none of its own)"""
    unsupported: str | None = None
    """when set, the backend cannot run several processes: the one-line reason"""

    @abstractmethod
    def launch(self, spec: LaunchSpec, env: dict[str, str], address: str) -> int:
        """Run this node's share of the job with ``env`` (the common variables already
        set) and this node's ``address``; return the exit code."""
