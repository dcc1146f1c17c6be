"""``polytrain launch``: several processes (and machines) through each backend's own engine.

The backend's plugin declares how its engine starts processes, as a
:class:`~polytrain.distributed.launcher.Launcher`; the caller looks it up and passes it
in. What is common happens here, before anything starts: node 0 must be able to listen
on the master port (a port in use is an error now, not a hang later), and the address
this node uses towards the master is read from the routing table and handed to the
launcher (and to gloo as ``GLOO_SOCKET_IFNAME``): with several interfaces, or in a
network namespace, the host name often resolves to an address the other nodes cannot
reach (:mod:`polytrain.distributed.network`).

Timeouts: the engine's launcher must start this node's workers within ``--timeout``
seconds, then the workers bound their own rendezvous and every collective
(``polytrain train --timeout``). Worker output goes to ``LOG_DIR/workerlog.<rank>``, and
rank 0's to the console too (:mod:`polytrain.distributed.console_tail`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from polytrain.distributed.cluster import LAUNCH_WORLD_VAR
from polytrain.distributed.console_tail import FollowLog
from polytrain.distributed.launcher import Launcher, LaunchSpec
from polytrain.distributed.network import check_master_port, interface_of, node_address
from polytrain.distributed.supervisor import python_command
from polytrain.errors import ConfigError
from polytrain.utils.threads import cpu_count


def engine_env(spec: LaunchSpec, address: str) -> dict[str, str]:
    """Variables for every process of this node."""
    env = {LAUNCH_WORLD_VAR: str(spec.world_size), "PYTHONUNBUFFERED": "1"}
    if not (os.environ.get("POLYTRAIN_THREADS") or os.environ.get("OMP_NUM_THREADS")):
        # the node's CPUs shared out, the same for every engine (some launchers would say 1)
        env["POLYTRAIN_THREADS"] = str(max(1, cpu_count() // spec.nproc_per_node))
    interface = interface_of(address)
    if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = interface  # gloo otherwise resolves the host name
    return env


def check_command(command: list[str], path: str | None) -> None:
    """The worker command must exist here before any engine starts (else every engine
    prints its own tracebacks, once per worker)."""
    cmd = python_command(command)
    program = cmd[0]
    if shutil.which(program, path=path) is None:
        where = "not an executable file" if os.sep in program else "not found on PATH"
        raise ConfigError(
            f"The worker command {program!r} cannot be run ({where}). Give a program on "
            "PATH, a path to one, or a Python script, e.g. -- polytrain train ..."
        )
    script = cmd[1] if len(cmd) > 1 and program == sys.executable else None
    if script is not None and script.endswith(".py") and not os.path.isfile(script):
        raise ConfigError(f"The worker script {script!r} does not exist (from {os.getcwd()}).")


def launch(spec: LaunchSpec, launcher: Launcher) -> int:
    """Run one node's share of the job through ``launcher``; returns the exit code."""
    if launcher.backend != spec.backend:
        raise ConfigError(
            f"The launcher given is {launcher.name} for backend {launcher.backend!r}, "
            f"but the job is for backend {spec.backend!r}."
        )
    if launcher.unsupported:
        raise ConfigError(launcher.unsupported)
    check_command(spec.command, spec.env.get("PATH", os.environ.get("PATH")))
    check_master_port(spec)
    address = node_address(spec)
    env = {**os.environ, **engine_env(spec, address), **spec.env}
    follow = spec.log_dir and spec.node_rank == 0 and not launcher.shows_rank_zero
    rank_zero = FollowLog(Path(spec.log_dir, "workerlog.0")) if follow and spec.log_dir else None
    with rank_zero or contextlib.nullcontext():
        return launcher.launch(spec, env, address)
