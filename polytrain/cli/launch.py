"""``polytrain launch`` (a command on several processes, through the backend's own
engine) and ``polytrain env`` (which process this is)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from polytrain.errors import ConfigError

if TYPE_CHECKING:
    from polytrain.distributed.launcher import Launcher


def launcher_for(backend: str) -> Launcher:
    """The launcher the plugin of ``backend`` registers; one clear error if there is none."""
    from polytrain.plugins.registry import registered_launchers, resolve_backend_name

    resolve_backend_name(backend)  # unknown, broken or not installed: its own clear error
    launchers = registered_launchers()
    if backend not in launchers:
        raise ConfigError(
            f"Backend {backend!r} registers no launcher, so polytrain launch cannot start its "
            "processes; its plugin must implement polytrain_register_launchers."
        )
    return launchers[backend]


def cmd_launch(args: argparse.Namespace) -> int:
    """Run a command on several processes through the backend's own engine."""
    from polytrain.distributed.launch import launch
    from polytrain.distributed.launcher import LaunchSpec

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if args.log_dir is not None:
        from polytrain.io.run_dir import writable_dir

        writable_dir(args.log_dir, "--log-dir")
    spec = LaunchSpec(
        backend=args.backend,
        command=command,
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master=args.master,
        log_dir=args.log_dir,
        num_servers=args.num_servers,
        host=args.host,
        timeout=args.timeout,
    )
    return launch(spec, launcher_for(args.backend))


def cmd_env(args: argparse.Namespace) -> int:
    """Which process this is, as the launcher's environment says."""
    from polytrain.distributed.cluster import explain, resolve
    from polytrain.plugins.registry import cluster_environments

    info = resolve(environments=cluster_environments())
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(info), indent=2))
    elif args.explain:
        print(explain(info))
    else:
        print(
            f"rank {info.rank} of {info.world_size} (local {info.local_rank} of "
            f"{info.local_world_size}), source {info.source}"
        )
    return 0
