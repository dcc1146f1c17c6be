"""How ``polytrain launch`` starts processes on one backend's engine, as its plugin
declares it.

A backend plugin registers one :class:`Launcher` through the
``polytrain_register_launchers`` hook. :func:`polytrain.distributed.launch.launch` does
what is common (checks, addresses, the environment) and hands this node's share of the
job, a :class:`LaunchSpec`, to the launcher of the backend named by ``--backend``. The
launcher's :attr:`Launcher.environment` tells a worker its rank and world from that
engine's variables (:func:`polytrain.distributed.cluster.resolve`). Helpers for writing
one are in :mod:`polytrain.distributed.supervisor`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from polytrain.distributed.cluster import ClusterEnvironment
from polytrain.errors import ConfigError


@dataclass
class LaunchSpec:
    """One node's share of a job."""

    backend: str
    command: list[str]
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master: str = "127.0.0.1:29500"
    log_dir: str | None = None
    num_servers: int = 1  # parameter-server engines: servers per node
    host: str | None = None  # this node's address as the others reach it (default: routed)
    timeout: float = 300.0  # for the engine's launchers to meet and start the workers
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("Give the command to run after '--', e.g. -- polytrain train ...")
        if self.nproc_per_node < 1 or self.nnodes < 1 or self.num_servers < 1:
            raise ConfigError("--nproc-per-node, --nnodes and --num-servers must be >= 1.")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1} "
                f"(--nnodes {self.nnodes})."
            )
        host, _, port = self.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--master must be HOST:PORT, got {self.master!r}.")
        if not 0 < self.timeout < float("inf"):  # NaN and inf too
            raise ConfigError(
                f"--timeout must be a positive number of seconds, got {self.timeout}."
            )

    @property
    def master_addr(self) -> str:
        return self.master.rpartition(":")[0].strip("[]")

    @property
    def master_port(self) -> int:
        return int(self.master.rpartition(":")[2])

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


class Launcher(ABC):
    """One backend's way of starting N processes per node."""

    backend: ClassVar[str]
    """the backend it launches (``--backend``)"""
    name: ClassVar[str]
    """the engine's launcher, for messages (``torchrun``)"""
    environment: ClassVar[ClusterEnvironment | None] = None
    """how a worker reads this launcher's variables (None: it sets none of its own)"""
    shows_rank_zero: ClassVar[bool] = False
    """the engine's launcher prints rank 0's output on its console itself (Paddle's);
    otherwise ``polytrain launch --log-dir`` follows ``workerlog.0`` there"""
    unsupported: ClassVar[str | None] = None
    """when set, the backend cannot run several processes: the one-line reason, which
    ``polytrain launch`` prints instead of launching"""

    @abstractmethod
    def launch(self, spec: LaunchSpec, env: dict[str, str], address: str) -> int:
        """Run this node's share of the job with ``env`` (the common variables already
        set) and this node's ``address`` towards the master; return the exit code."""
