"""Helpers for plugin launchers: running an engine's own launcher program under supervision.

:class:`EngineLauncher` is a :class:`~polytrain.distributed.launcher.Launcher` for engines
that ship a launcher program (it starts this node's workers itself): the plugin gives
the command line, built with :func:`worker_command` so that every worker runs inside
:mod:`polytrain.distributed.worker_log`; :func:`supervise` runs it. The engine's launcher
must start this node's workers within ``--timeout`` seconds; if a worker dies the engine
stops the others, the exit code is non-zero, and the worker that failed first is named,
with the end of its log (:func:`print_log_tail`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from polytrain.distributed.launcher import Launcher, LaunchSpec
from polytrain.distributed.network import probe_master
from polytrain.distributed.worker_log import read_statuses
from polytrain.errors import ClusterError

GRACE_SECONDS = 5.0
POLL_SECONDS = 0.2
LOG_TAIL_LINES = 8
WRAPPER = [sys.executable, "-m", "polytrain.distributed.worker_log"]


def python_command(command: Sequence[str]) -> list[str]:
    """``polytrain ...``, ``python ...`` and ``script.py ...`` run with this interpreter."""
    cmd = list(command)
    if cmd and cmd[0] in ("python", "python3"):
        return [sys.executable, *cmd[1:]]
    if cmd and cmd[0] == "polytrain":
        return [sys.executable, "-m", "polytrain", *cmd[1:]]
    if cmd and cmd[0].endswith(".py"):
        return [sys.executable, *cmd]
    return cmd


def worker_command(
    spec: LaunchSpec, status_dir: Path, rank_variable: str, *, log: bool = True
) -> list[str]:
    """The user's command inside :mod:`polytrain.distributed.worker_log`, which reads the
    worker's rank from ``rank_variable``, records how it ended in ``status_dir`` and, with
    ``log``, writes its output to ``LOG_DIR/workerlog.<rank>``."""
    options = ["--rank-var", rank_variable, "--status-dir", str(status_dir)]
    if log and spec.log_dir is not None:
        options += ["--log-dir", spec.log_dir]
    return [*WRAPPER, *options, "--", *python_command(spec.command)]


class EngineLauncher(Launcher):
    """A launcher whose engine ships its own launcher program: :meth:`command` builds its
    command line (workers wrapped by :func:`worker_command`), :func:`supervise` runs it."""

    rank_variable: ClassVar[str]
    """the variable the engine sets to each worker's global rank"""

    @abstractmethod
    def command(self, spec: LaunchSpec, status_dir: Path, address: str) -> list[str]:
        """The engine's launcher for this node; its workers report to ``status_dir``."""

    def worker_command(self, spec: LaunchSpec, status_dir: Path, *, log: bool = True) -> list[str]:
        return worker_command(spec, status_dir, self.rank_variable, log=log)

    def launch(self, spec: LaunchSpec, env: dict[str, str], address: str) -> int:
        with tempfile.TemporaryDirectory(prefix="polytrain-status-") as status:
            cmd = self.command(spec, Path(status), address)
            return supervise(cmd, env, spec, self.name, Path(status), self.rank_variable)


def supervise(
    cmd: list[str],
    env: dict[str, str],
    spec: LaunchSpec,
    name: str,
    status_dir: Path,
    rank_variable: str,
) -> int:
    """Run an engine's launcher ``name``: forward SIGINT/SIGTERM, bound the start of this
    node's workers (found by ``rank_variable``), name the worker that failed first."""
    workers = _Workers(status_dir, rank_variable)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        os.killpg(proc.pid, signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    workers.launcher_pid = proc.pid
    deadline = time.monotonic() + spec.timeout
    try:
        while proc.poll() is None:
            workers.update()
            if not workers.started(spec.nproc_per_node) and time.monotonic() > deadline:
                _reap_group(proc)
                raise ClusterError(_not_started(spec, name))
            time.sleep(POLL_SECONDS)
        code = proc.returncode
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _reap_group(proc)
    if code != 0:
        failed = workers.first_failure()
        which = failed[1] if failed else "no worker failure was recorded"
        print(f"polytrain launch: {name} exited with code {code}; {which}.", file=sys.stderr)
        if failed:
            print_log_tail(spec.log_dir, f"workerlog.{failed[0]}")
    return code if code >= 0 else 128 - code


def _not_started(spec: LaunchSpec, name: str) -> str:
    return (
        f"The workers of node {spec.node_rank} did not start within {spec.timeout:.0f} s "
        f"(--timeout): {name} of the {spec.nnodes} node(s) did not meet at the master "
        f"{spec.master}; {probe_master(spec)}. Check that node rank 0 runs, that "
        f"{spec.master} is reachable from here, and that every node was given the same "
        f"--nnodes ({spec.nnodes}) and --nproc-per-node ({spec.nproc_per_node})."
    )


class _Workers:
    """The workers an engine's launcher started on this node: found in /proc (Linux) by
    their rank variable, to bound the start; their exit records (written by
    :mod:`polytrain.distributed.worker_log`) name the one that failed first."""

    def __init__(self, status_dir: Path, rank_variable: str) -> None:
        self.status_dir = status_dir
        self.rank_variable = rank_variable.encode()
        self.launcher_pid = 0
        self.seen: set[int] = set()

    def started(self, expected: int) -> bool:
        return len(self.seen) >= expected or not Path("/proc").is_dir()

    def update(self) -> None:
        for pid in _children(self.launcher_pid) - self.seen:
            if self._has_rank(pid):
                self.seen.add(pid)

    def first_failure(self) -> tuple[int, str] | None:
        """(rank, description) of the earliest worker that ended badly."""
        for record in read_statuses(self.status_dir):
            code = int(record["code"])
            if code != 0:
                rank, pid = int(record["rank"]), int(record["pid"])
                return rank, f"worker rank {rank} (pid {pid}) failed first: {ending(code)}"
        return None

    def _has_rank(self, pid: int) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return any(item.startswith(self.rank_variable + b"=") for item in environ)


def ending(code: int) -> str:
    """How a process ended, from its return code: ``exit code 3``, ``killed by SIGKILL``."""
    return f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _children(pid: int) -> set[int]:
    """Direct children of a process (scanning /proc; empty where there is none)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields and int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def print_log_tail(log_dir: str | None, name: str, lines: int = LOG_TAIL_LINES) -> None:
    """The last lines of a worker's log, where the reason of a failure usually is."""
    if log_dir is None:
        return
    path = Path(log_dir) / name
    try:
        text = path.read_text(errors="replace").rstrip().splitlines()[-lines:]
    except OSError:
        return
    if text:
        print(f"polytrain launch: last lines of {path}:", file=sys.stderr)
        for line in text:
            print(f"  | {line}", file=sys.stderr)


def _reap_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop anything the engine's launcher left behind in its process group."""
    for sig, grace in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, GRACE_SECONDS)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie still counts as a group member
            if not _group_alive(proc.pid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    """Does any process of the group still run (zombies excluded)?"""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    if not Path("/proc").is_dir():  # elsewhere: ask the kernel (zombies count there)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return False
