"""How ``polytrain launch --backend paddle`` starts processes: ``paddle.distributed.launch``
(never ``--devices`` on CPU: it fails there; no restarts: a failed worker fails the job);
and how a worker reads its variables. Imports no paddle: the launcher runs in its own process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from polytrain.distributed.cluster import (
    ClusterEnvironment,
    ClusterInfo,
    VariableReader,
    check_below,
    parse_port,
)
from polytrain.distributed.launcher import LaunchSpec
from polytrain.distributed.supervisor import EngineLauncher
from polytrain.errors import ClusterError


def _endpoint(name: str, entry: str) -> tuple[str, int]:
    host, _, port = entry.strip().rpartition(":")
    if not host:
        raise ClusterError(
            f"{name} has {entry!r}, which is not host:port. paddle.distributed.launch writes "
            "e.g. 10.0.0.1:6170,10.0.0.2:6170."
        )
    return host.strip("[]"), parse_port(f"the port in {name}", port)


class PaddleEnvironment(ClusterEnvironment):
    """The variables of ``paddle.distributed.launch``."""

    name = "paddle"
    variables = ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS")
    labels = "PADDLE_TRAINER_ID PADDLE_TRAINERS_NUM PADDLE_LOCAL_RANK - - -"

    def read_info(self, r: VariableReader) -> ClusterInfo:
        rank = r.integer("PADDLE_TRAINER_ID")
        world = r.integer("PADDLE_TRAINERS_NUM", minimum=1)
        check_below(rank, "PADDLE_TRAINER_ID", world, "PADDLE_TRAINERS_NUM")
        listed = r.get("PADDLE_TRAINER_ENDPOINTS")
        if listed is None:
            if world > 1:
                raise ClusterError(
                    f"PADDLE_TRAINERS_NUM={world} but PADDLE_TRAINER_ENDPOINTS is not set. Set "
                    "it to every trainer's host:port in rank order, or launch with "
                    "python -m paddle.distributed.launch."
                )
            master: tuple[str | None, int | None] = (None, None)
            mine, endpoints = ("localhost", 0), [("localhost", 0)]
        else:
            endpoints = [_endpoint("PADDLE_TRAINER_ENDPOINTS", e) for e in listed.split(",")]
            if len(endpoints) != world:
                raise ClusterError(
                    f"PADDLE_TRAINER_ENDPOINTS lists {len(endpoints)} endpoints but "
                    f"PADDLE_TRAINERS_NUM={world}; there must be one per trainer."
                )
            master, mine = endpoints[0], endpoints[rank]
            current = r.get("PADDLE_CURRENT_ENDPOINT")
            if current is not None and _endpoint("PADDLE_CURRENT_ENDPOINT", current) != mine:
                raise ClusterError(
                    f"PADDLE_CURRENT_ENDPOINT={current!r} is not entry {rank} of "
                    f"PADDLE_TRAINER_ENDPOINTS ({mine[0]}:{mine[1]}), which "
                    f"PADDLE_TRAINER_ID={rank} points to. Fix whichever was set by hand."
                )
            r.notes.append(
                "paddle: master is the first endpoint; local rank counts endpoints "
                f"on host {mine[0]}"
            )
        same_host = [i for i, (host, _) in enumerate(endpoints) if host == mine[0]]
        hosts = list(dict.fromkeys(host for host, _ in endpoints))
        local = r.integer("PADDLE_LOCAL_RANK", "PADDLE_RANK_IN_NODE", default=same_host.index(rank))
        node_rank = hosts.index(mine[0])
        return r.info(rank, world, local, len(same_host), node_rank, len(hosts), master)


class PaddleLauncher(EngineLauncher):
    """paddle.distributed.launch runs the wrapper (a "training script" not ending in .py is
    run as a command); its own ``--log_dir`` writes ``workerlog.N``."""

    backend = "paddle"
    name = "paddle.distributed.launch"
    shows_rank_zero = True  # measured: rank 0's output on its console, beside workerlog.0
    environment = PaddleEnvironment()
    rank_variable = "PADDLE_TRAINER_ID"

    def command(self, spec: LaunchSpec, status_dir: Path, address: str) -> list[str]:
        args = [sys.executable, "-m", "paddle.distributed.launch",
                "--nnodes", str(spec.nnodes), "--nproc_per_node", str(spec.nproc_per_node),
                "--log_dir", spec.log_dir or "log", "--job_id", "polytrain",
                "--max_restart", "0"]  # fmt: skip
        if spec.nnodes > 1:
            # --host: else Paddle takes the host name's address, often not the routed one
            args += ["--master", spec.master, "--rank", str(spec.node_rank), "--host", address]
        else:
            args += ["--start_port", str(spec.master_port)]
        return [*args, *self.worker_command(spec, status_dir, log=False)]
