"""A launcher program for engines that ship none (JAX): this node's workers, started and
watched, as torchrun does for torch.

``python -m polytrain.distributed.spawn --nproc-per-node N --node-rank R --nnodes M
--master HOST:PORT --prefix P -- CMD...`` starts N copies of ``CMD`` (the plugin passes
them inside :mod:`polytrain.distributed.worker_log`), each with ``P``RANK, ``P``WORLD_SIZE,
``P``LOCAL_RANK, ``P``LOCAL_WORLD_SIZE, ``P``NODE_RANK, ``P``NNODES, MASTER_ADDR and
MASTER_PORT set. When a worker fails, the others get SIGTERM (then SIGKILL after
:data:`STOP_SECONDS`): a rank whose peer is gone would otherwise wait in a collective. It
exits 0 when every worker did, else with the first failure's code. SIGTERM/SIGINT to it go
on to the workers (``polytrain launch`` signals the workers itself; this covers a
launcher that died: it gets SIGTERM from the kernel). Imports no framework.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from polytrain.distributed.worker_log import die_with_parent

POLL_SECONDS = 0.1
STOP_SECONDS = 30.0  # for the other workers to end after one failed


def worker_env(args: argparse.Namespace, local_rank: int) -> dict[str, str]:
    """The variables of worker ``local_rank`` of this node."""
    host, _, port = args.master.rpartition(":")
    p, n = args.prefix, args.nproc_per_node
    values = {
        "RANK": args.node_rank * n + local_rank, "WORLD_SIZE": args.nnodes * n,
        "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": n,
        "NODE_RANK": args.node_rank, "NNODES": args.nnodes,
    }  # fmt: skip
    env = {f"{p}{name}": str(value) for name, value in values.items()}
    return {**os.environ, **env, "MASTER_ADDR": host.strip("[]"), "MASTER_PORT": port}


def _start(args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(args.command, env=worker_env(args, i), preexec_fn=die_with_parent)
        for i in range(args.nproc_per_node)
    ]


def _stop(workers: Sequence[subprocess.Popen[bytes]], sig: int) -> None:
    for proc in workers:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)


def _exit_code(code: int) -> int:
    """A shell's exit code for a worker's: 128 + N when signal N ended it."""
    return code if code >= 0 else 128 - code


def watch(workers: Sequence[subprocess.Popen[bytes]]) -> int:
    """Wait for every worker; after the first failure stop the rest. The exit code."""
    failed = 0
    deadline = float("inf")
    while None in [proc.poll() for proc in workers]:  # each polled: any() would stop early
        codes = [proc.returncode for proc in workers if proc.returncode not in (None, 0)]
        if codes and not failed:
            failed = _exit_code(codes[0])
            _stop(workers, signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECONDS
        if time.monotonic() > deadline:
            _stop(workers, signal.SIGKILL)
        time.sleep(POLL_SECONDS)
    return failed or _exit_code(next((p.returncode for p in workers if p.returncode != 0), 0))


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m polytrain.distributed.spawn")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0")
    parser.add_argument("--prefix", required=True, help="the variables' prefix")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("give the command after --")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    workers = _start(args)

    def forward(signum: int, _frame: object) -> None:
        _stop(workers, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    return watch(workers)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
