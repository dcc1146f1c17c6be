"""Helpers for plugin launchers: running an engine's own launcher program under supervision.

:class:`EngineLauncher` is a :class:`~polytrain.distributed.launcher.Launcher` for engines
that ship a launcher program (it starts this node's workers itself): the plugin gives
the command line, built with :func:`worker_command` so that every worker runs inside
:mod:`polytrain.distributed.worker_log`; :func:`supervise` runs it. The engine's launcher
must start this node's workers within ``--timeout`` seconds; if a worker dies the engine
stops the others, the exit code is non-zero, and the worker that failed first is named,
with the end of its log (:func:`print_log_tail`).

Signals: SIGTERM or SIGINT goes to the workers only (each stops at the step boundary all
processes agree on and rank 0 saves), the engine's launcher then ends by itself and
``polytrain launch`` exits 128 + signal; a second signal, or workers still running
:data:`STOP_GRACE_SECONDS` later, ends the process group at once. The engine's launcher
gets SIGTERM if ``polytrain launch`` itself dies (even by SIGKILL), and so does each
worker's wrapper if the engine's launcher dies: nothing outlives the launcher.
"""

from __future__ import annotations

import contextlib
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
from polytrain.distributed.watchdog import PROGRESS_DIR_VAR, stalled
from polytrain.distributed.worker_log import (
    STOP_FILE,
    die_with_parent,
    full_log_dir,
    obeyed,
    read_statuses,
)
from polytrain.errors import ClusterError

GRACE_SECONDS = 5.0
STOP_GRACE_SECONDS = 60.0  # for workers to finish their step and save after SIGTERM/SIGINT
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
            env = {**env, PROGRESS_DIR_VAR: status}  # the workers' heartbeats
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
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_engine_launcher_setup)
    stop = _Stop(proc, workers)
    old = {s: signal.signal(s, stop.request) for s in (signal.SIGINT, signal.SIGTERM)}
    workers.launcher_pid = proc.pid
    deadline = time.monotonic() + spec.timeout
    try:
        while proc.poll() is None:
            workers.update()
            if stop.overdue():
                break
            if not workers.started(spec.nproc_per_node) and time.monotonic() > deadline:
                if stop.signal:
                    break
                _reap_group(proc)
                raise ClusterError(_not_started(spec, name))
            time.sleep(POLL_SECONDS)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _reap_group(proc)
    code = proc.returncode
    if stop.signal:
        code = stop.report(spec, name)
        _pass_on(stop.signal, old[signal.Signals(stop.signal)])
        return code
    if code != 0:
        failed = workers.first_failure()
        which = (
            failed[1]
            if failed
            else (full_log_dir(spec.log_dir) or "no worker failure was recorded")
        )
        print(f"polytrain launch: {name} exited with code {code}; {which}.", file=sys.stderr)
        if failed:
            print_log_tail(spec.log_dir, f"workerlog.{failed[0]}")
    return code if code >= 0 else 128 - code


def _pass_on(signum: int, handler: object) -> None:
    """The signal handler that was in place before, when it is the caller's own Python
    function (``polytrain doctor``'s stop, which then ends the command), hears of the stop
    once the workers have stopped; the defaults (``polytrain launch``'s) are left out."""
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signum, None)


def _engine_launcher_setup() -> None:  # in the engine's launcher, before exec
    die_with_parent(signal.SIGTERM)  # it then stops its workers as after a signal


class _Stop:
    """SIGINT/SIGTERM to ``polytrain launch``: the workers stop (and save) first."""

    def __init__(self, proc: subprocess.Popen[bytes], workers: _Workers) -> None:
        self.proc, self.workers = proc, workers
        self.signal = 0
        self.since = 0.0

    def request(self, signum: int, _frame: object) -> None:
        first = not self.signal
        self.signal, self.since = signum, self.since or time.monotonic()
        self.workers.update()
        if first and self.workers.seen:  # the wrappers pass it on to the workers
            (self.workers.status_dir / STOP_FILE).write_text(str(signum))
            targets = list(self.workers.seen)
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
        else:  # not started yet, or asked twice: the engine's whole group, at once
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL if not first else signum)

    def overdue(self) -> bool:
        return bool(self.signal) and time.monotonic() - self.since > STOP_GRACE_SECONDS

    def report(self, spec: LaunchSpec, name: str) -> int:
        """One line on how the stop went; the exit code is 128 + the signal."""
        sig = self.signal
        records = read_statuses(self.workers.status_dir)
        failed = [r for r in records if int(r["code"]) != 0 and not obeyed(int(r["code"]), sig)]
        how = f"polytrain launch: stopped by {signal_name(sig)}"
        if failed:
            rank, code = int(failed[0]["rank"]), int(failed[0]["code"])
            print(f"{how}; worker rank {rank} did not stop cleanly: {ending(code)}.",
                  file=sys.stderr)  # fmt: skip
            print_log_tail(spec.log_dir, f"workerlog.{rank}")
        elif self.overdue():
            print(f"{how}; the workers did not end within {STOP_GRACE_SECONDS:.0f} s and "
                  "were killed.", file=sys.stderr)  # fmt: skip
        else:
            ended = len(records)
            print(f"{how}; {ended} worker(s) of this node stopped and "
                  f"exited; {name} ended.", file=sys.stderr)  # fmt: skip
        return 128 + sig


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
                text = f"worker rank {rank} (pid {pid}) failed first: {ending(code)}"
                if record.get("reason"):
                    text += f" ({record['reason']})"
                return rank, text + after_stall(self.status_dir, record["time"], rank)
        return None

    def _has_rank(self, pid: int) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return any(item.startswith(self.rank_variable + b"=") for item in environ)


def after_stall(folder: Path | None, when: float, rank: int) -> str:
    """``, after rank 1 (pid 7) stopped responding 9 s earlier (...)``: the rank that hung
    the job, when a rank of this node stopped responding before ``rank`` failed."""
    culprits = stalled(folder, when, exclude=rank)
    return "".join(f", after {c.describe(when)}" for c in culprits[:1])


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
    """Stop anything the engine's launcher left behind in its process group, and collect
    the launcher's exit status (a leader that died after the last look was left a zombie,
    and its ``Popen`` warned "still running")."""
    _stop_group(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE_SECONDS)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
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
