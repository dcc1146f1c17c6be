"""How ``polytrain launch --backend torch`` starts processes: torchrun (``torch.distributed.run``)
with a static rendezvous at ``--master``, no restarts; and how a worker reads torchrun's
variables. Imports no torch: torchrun runs in its own process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from polytrain.distributed.cluster import (
    ClusterEnvironment,
    ClusterInfo,
    VariableReader,
    read_rank_variables,
)
from polytrain.distributed.launcher import LaunchSpec
from polytrain.distributed.supervisor import EngineLauncher


class TorchrunEnvironment(ClusterEnvironment):
    """torchrun's variables (also set by hand: RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""

    name = "torchrun"
    variables = ("RANK", "WORLD_SIZE")
    labels = "RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE"

    def read_info(self, r: VariableReader) -> ClusterInfo:
        return read_rank_variables(r, self.labels)


class TorchrunLauncher(EngineLauncher):
    """torchrun runs the workers, each inside polytrain's worker wrapper (which writes
    ``workerlog.<rank>``)."""

    backend = "torch"
    name = "torchrun"
    environment = TorchrunEnvironment()
    rank_variable = "RANK"

    def command(self, spec: LaunchSpec, status_dir: Path, address: str) -> list[str]:
        return [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(spec.nnodes),
            "--node-rank", str(spec.node_rank),
            "--nproc-per-node", str(spec.nproc_per_node),
            "--master-addr", spec.master_addr,
            "--master-port", str(spec.master_port),
            "--max-restarts", "0",
            "--monitor-interval", "0.5",
            "--no-python",
            *self.worker_command(spec, status_dir, log=True),
        ]  # fmt: skip
