"""``polytrain launch``: several processes (and machines) through each framework's own engine.

* torch: ``torch.distributed.run`` (torchrun), static rendezvous at ``--master``;
* paddle: ``paddle.distributed.launch`` (never ``--devices`` on CPU: it fails there);
* mxnet: the parameter server of ps-lite: a scheduler, servers and workers started here
  with the ``DMLC_*`` variables (MXNet ships no launcher in its wheel).

Worker output goes to ``LOG_DIR/workerlog.<rank>``. If a worker dies, the others are
stopped and the exit code is non-zero with the failed rank named; nothing waits forever.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

GRACE_SECONDS = 10.0


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
    num_servers: int = 1
    host: str | None = None  # this node's address (MXNet's DMLC_NODE_HOST)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("Give the command to run after '--', e.g. -- polytrain train ...")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ConfigError("--nproc-per-node and --nnodes must be >= 1.")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1} "
                f"(--nnodes {self.nnodes})."
            )
        host, _, port = self.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--master must be HOST:PORT, got {self.master!r}.")

    @property
    def master_addr(self) -> str:
        return self.master.rpartition(":")[0]

    @property
    def master_port(self) -> int:
        return int(self.master.rpartition(":")[2])

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def python_command(command: Sequence[str]) -> list[str]:
    """``polytrain ...`` and ``script.py ...`` run with this interpreter."""
    cmd = list(command)
    if cmd and cmd[0] == "polytrain":
        return [sys.executable, "-m", "polytrain", *cmd[1:]]
    if cmd and cmd[0].endswith(".py"):
        return [sys.executable, *cmd]
    return cmd


def _with_log(spec: LaunchSpec, cmd: list[str]) -> list[str]:
    if spec.log_dir is None:
        return cmd
    return [sys.executable, "-m", "polytrain.worker_log", spec.log_dir, *cmd]


def torchrun_command(spec: LaunchSpec) -> list[str]:
    """torchrun with a static rendezvous; workers exec the command (logged per rank)."""
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
        *_with_log(spec, python_command(spec.command)),
    ]  # fmt: skip


def paddle_command(spec: LaunchSpec) -> list[str]:
    """paddle.distributed.launch; its own --log_dir writes workerlog.N."""
    cmd = python_command(spec.command)
    entry = str(Path(__file__).with_name("launch_entry.py"))
    if cmd[:3] == [sys.executable, "-m", "polytrain"]:
        script = [entry, *cmd[3:]]
    elif cmd[:2] == [sys.executable, "-m"] and len(cmd) > 2:  # python -m MODULE: via runpy
        script = [entry, "-m", *cmd[2:]]
    elif cmd[0] == sys.executable and cmd[1].endswith(".py"):
        script = cmd[1:]
    else:
        raise ConfigError(
            "paddle.distributed.launch runs Python scripts only: "
            "give 'polytrain ...', 'python -m MODULE ...' or a .py file."
        )
    args = [sys.executable, "-m", "paddle.distributed.launch",
            "--nnodes", str(spec.nnodes), "--nproc_per_node", str(spec.nproc_per_node),
            "--log_dir", spec.log_dir or "log", "--job_id", "polytrain"]  # fmt: skip
    if spec.nnodes > 1:
        args += ["--master", spec.master, "--rank", str(spec.node_rank)]
    else:
        args += ["--start_port", str(spec.master_port)]
    return [*args, *script]


def launch(spec: LaunchSpec) -> int:
    """Run one node's share of the job; returns the exit code."""
    env = {**os.environ, **spec.env}
    if spec.backend == "torch":
        return _supervise_one(torchrun_command(spec), env, "torchrun")
    if spec.backend == "paddle":
        return _supervise_one(paddle_command(spec), env, "paddle.distributed.launch")
    if spec.backend == "mxnet":
        from .ps_launch import launch_parameter_server

        return launch_parameter_server(spec, env)
    raise ConfigError(f"No launcher for backend {spec.backend!r}; use torch, paddle or mxnet.")


def _supervise_one(cmd: list[str], env: dict[str, str], name: str) -> int:
    """Run a framework launcher; forward SIGINT/SIGTERM; report a failure."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        os.killpg(proc.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _reap_group(proc.pid)
    if code != 0:
        print(f"polytrain launch: {name} exited with code {code}; see its report above "
              "(it names the failed rank) and the worker logs.", file=sys.stderr)  # fmt: skip
    return code


def _reap_group(pgid: int) -> None:
    """Stop anything the launcher left behind in its process group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
