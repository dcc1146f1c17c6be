"""How ``polytrain launch --backend jax`` starts processes: JAX ships no launcher, so
polytrain's own (:mod:`polytrain.distributed.spawn`) starts this node's workers with
``POLYTRAIN_JAX_*`` variables, and each worker joins ``jax.distributed`` at ``--master``
with Gloo's CPU collectives (the backend's ``init_distributed``). Imports no jax.
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
from polytrain.distributed.network import wait_for_master
from polytrain.distributed.supervisor import EngineLauncher

PREFIX = "POLYTRAIN_JAX_"
JOIN_TIMEOUT_VAR = f"{PREFIX}JOIN_TIMEOUT"  # launch's --timeout: for the workers to meet


class JaxEnvironment(ClusterEnvironment):
    """The variables polytrain's spawner sets for a jax worker."""

    name = "jax"
    variables = (f"{PREFIX}RANK",)
    labels = " ".join(
        PREFIX + v
        for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES")
    )

    def read_info(self, r: VariableReader) -> ClusterInfo:
        return read_rank_variables(r, self.labels)


class JaxLauncher(EngineLauncher):
    """polytrain's spawner runs the workers, each inside the worker wrapper."""

    backend = "jax"
    name = "polytrain.distributed.spawn"
    environment = JaxEnvironment()
    rank_variable = f"{PREFIX}RANK"

    def launch(self, spec: LaunchSpec, env: dict[str, str], address: str) -> int:
        if spec.node_rank > 0:  # its workers would wait in jax.distributed's join
            wait_for_master(spec, "jax.distributed's coordinator (rank 0)")
        return super().launch(spec, {**env, JOIN_TIMEOUT_VAR: str(spec.timeout)}, address)

    def command(self, spec: LaunchSpec, status_dir: Path, address: str) -> list[str]:
        return [
            sys.executable, "-m", "polytrain.distributed.spawn",
            "--nproc-per-node", str(spec.nproc_per_node),
            "--node-rank", str(spec.node_rank),
            "--nnodes", str(spec.nnodes),
            "--master", spec.master,
            "--prefix", PREFIX,
            "--", *self.worker_command(spec, status_dir, log=True),
        ]  # fmt: skip
