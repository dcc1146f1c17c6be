"""MXNet's parameter-server job on one node: scheduler (node 0), servers and workers.

ps-lite reads its topology from ``DMLC_*`` variables. The scheduler and the servers are
plain ``import mxnet`` processes (MXNet runs the server loop at import when
``DMLC_ROLE`` says so); workers run the user's command. This supervisor stops every
process of the node when a worker fails, and names the failed rank.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from .launch import LaunchSpec

POLL_SECONDS = 0.2
SERVER_EXIT_SECONDS = 30.0


@dataclass
class _Proc:
    role: str
    index: int
    popen: subprocess.Popen[bytes]
    log: IO[bytes] | None

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}"


def dmlc_env(spec: LaunchSpec, role: str, base: dict[str, str]) -> dict[str, str]:
    """The ps-lite variables of one process of this node."""
    host = spec.host or ("127.0.0.1" if spec.master_addr in ("127.0.0.1", "localhost") else "")
    env = {
        **base,
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": spec.master_addr,
        "DMLC_PS_ROOT_PORT": str(spec.master_port),
        "DMLC_NUM_WORKER": str(spec.world_size),
        "DMLC_NUM_SERVER": str(spec.num_servers * spec.nnodes),
        "POLYTRAIN_LOCAL_WORLD_SIZE": str(spec.nproc_per_node),
    }
    if host:
        env["DMLC_NODE_HOST"] = host  # ps-lite otherwise guesses an interface (fails on loopback)
    return env


def _start(
    role: str, index: int, cmd: list[str], env: dict[str, str], log_path: Path | None
) -> _Proc:
    log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - closed by the supervisor
    popen = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)
    return _Proc(role, index, popen, log)


def launch_parameter_server(spec: LaunchSpec, base_env: dict[str, str]) -> int:
    """Start this node's scheduler/servers/workers, wait for the workers, clean up."""
    from .launch import python_command

    log_dir = Path(spec.log_dir) if spec.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)

    def log(name: str) -> Path | None:
        return log_dir / name if log_dir else None

    import_mxnet = [sys.executable, "-c", "import mxnet"]
    procs: list[_Proc] = []
    if spec.node_rank == 0:
        env = dmlc_env(spec, "scheduler", base_env)
        procs.append(_start("scheduler", 0, import_mxnet, env, log("schedulerlog")))
    for i in range(spec.num_servers):
        index = spec.node_rank * spec.num_servers + i
        env = dmlc_env(spec, "server", base_env)
        procs.append(_start("server", index, import_mxnet, env, log(f"serverlog.{index}")))
    workers = []
    for i in range(spec.nproc_per_node):
        rank = spec.node_rank * spec.nproc_per_node + i
        env = dmlc_env(spec, "worker", base_env)
        env["POLYTRAIN_RANK"] = str(rank)  # provisional; the kvstore assigns the real rank
        env["POLYTRAIN_LOCAL_RANK"] = str(i)
        worker = _start("worker", rank, python_command(spec.command), env, log(f"workerlog.{rank}"))
        workers.append(worker)
        procs.append(worker)
    try:
        return _wait(procs, workers)
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait()
            if p.log:
                p.log.close()


def _wait(procs: list[_Proc], workers: list[_Proc]) -> int:
    while True:
        for p in procs:
            code = p.popen.poll()
            if code is not None and code != 0:
                print(
                    f"polytrain launch: {p.label} (pid {p.popen.pid}) failed with exit code "
                    f"{code}; "
                    "stopping the other processes of this node.",
                    file=sys.stderr,
                )
                _terminate(procs)
                return code if code > 0 else 128 - code
        if all(w.popen.poll() == 0 for w in workers):
            break
        time.sleep(POLL_SECONDS)
    deadline = time.monotonic() + SERVER_EXIT_SECONDS  # servers leave when workers finalize
    while any(p.popen.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    return 0


def _terminate(procs: list[_Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.terminate()
    deadline = time.monotonic() + 5.0
    while any(p.popen.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
