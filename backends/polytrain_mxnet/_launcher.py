"""How ``polytrain launch --backend mxnet`` starts processes: the parameter server of
ps-lite, one node's scheduler (node 0), servers and workers started here with the
``DMLC_*`` variables (MXNet ships no launcher in its wheel); and how a worker reads them.
Imports no mxnet: the scheduler and the servers are processes of their own.

ps-lite reads its topology from ``DMLC_*`` variables. The scheduler and the servers are
plain ``import mxnet`` processes (MXNet runs the server loop at import when
``DMLC_ROLE`` says so); workers run the user's command. ps-lite, not this launcher,
numbers the workers (by the random ports they listen on): each polytrain worker writes
its kvstore rank to a file this supervisor reads, so its log, first
``workerlog.slot<N>``, becomes ``workerlog.<rank>`` once it joined, and a failure names
the real rank. When any process of the node fails, the supervisor stops the others.

ps-lite has no timeouts: a node whose scheduler cannot be reached would wait forever, so
nodes other than 0 first wait (``--timeout``) until the scheduler's port answers; the
workers bound every later wait themselves (:mod:`polytrain.distributed.watchdog`).

Signals: SIGTERM/SIGINT go to the workers only; they stop at the step all of them agreed
on (rank 0 saves) and leave the kvstore, the servers and the scheduler then end, and the
launcher exits 128 + signal (a second signal, or :data:`STOP_GRACE_SECONDS`, ends every
process at once). Every process runs in a process group of its own and is killed by the
kernel if this launcher dies (Linux ``PR_SET_PDEATHSIG``; SIGKILL, since workers cannot
finish a step once their servers are gone).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from polytrain.distributed.cluster import (
    ClusterEnvironment,
    ClusterInfo,
    VariableReader,
    parse_port,
)
from polytrain.distributed.launcher import Launcher, LaunchSpec
from polytrain.distributed.network import wait_for_master
from polytrain.distributed.supervisor import (
    STOP_GRACE_SECONDS,
    after_stall,
    ending,
    print_log_tail,
    python_command,
    signal_name,
)
from polytrain.distributed.watchdog import PROGRESS_DIR_VAR
from polytrain.distributed.worker_log import die_with_parent, full_log_dir, obeyed
from polytrain.errors import ClusterError

from ._engine import launched_env

POLL_SECONDS = 0.2
SERVER_EXIT_SECONDS = 30.0
TERMINATE_SECONDS = 5.0
RANK_FILE_VAR = "POLYTRAIN_RANK_FILE"  # where a worker reports its rank (._parallel writes it)


class DMLCEnvironment(ClusterEnvironment):
    """ps-lite's ``DMLC_*`` variables, with the provisional rank this launcher passes down."""

    name = "dmlc"
    variables = ("DMLC_ROLE",)
    labels = "POLYTRAIN_RANK DMLC_NUM_WORKER POLYTRAIN_LOCAL_RANK POLYTRAIN_LOCAL_WORLD_SIZE - -"

    def read_info(self, r: VariableReader) -> ClusterInfo:
        role = r.get("DMLC_ROLE")
        if role not in ("worker", "server", "scheduler"):
            raise ClusterError(f"DMLC_ROLE={role!r} must be one of: worker, server, scheduler.")
        uri = r.get("DMLC_PS_ROOT_URI")
        port = r.get("DMLC_PS_ROOT_PORT")
        if not uri or port is None:
            raise ClusterError(
                "DMLC_ROLE is set but DMLC_PS_ROOT_URI or DMLC_PS_ROOT_PORT is not: every ps-lite "
                "process needs the scheduler's address. Export both, e.g. "
                "DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=9091."
            )
        master = (uri, parse_port("DMLC_PS_ROOT_PORT", port))
        workers = r.integer("DMLC_NUM_WORKER", minimum=1)
        servers = r.integer("DMLC_NUM_SERVER", minimum=1)
        # The scheduler hands out worker ranks when the kvstore is created; until then a
        # launcher (polytrain launch) may pass one down, else rank 0 stands in.
        rank = r.integer("POLYTRAIN_RANK", default=0) if role == "worker" else 0
        local_world = r.integer("POLYTRAIN_LOCAL_WORLD_SIZE", default=workers, minimum=1)
        local = r.integer("POLYTRAIN_LOCAL_RANK", default=rank % local_world)
        if role != "worker":
            r.notes.append(f"dmlc: this process is a {role}, not a worker; ranks are placeholders")
        else:
            given = "from POLYTRAIN_RANK" if "POLYTRAIN_RANK" in r.env else "0 (no POLYTRAIN_RANK)"
            r.notes.append(
                f"dmlc: provisional rank {given}; the scheduler assigns the real one "
                "when the kvstore is created"
            )
        node_rank, nodes = rank // local_world, -(-workers // local_world)
        info = r.info(rank, workers, local, local_world, node_rank, nodes, master)
        return replace(info, role=role, num_servers=servers)


@dataclass
class _Proc:
    role: str
    index: int  # launch slot: the provisional rank for workers
    popen: subprocess.Popen[bytes]
    log: IO[bytes] | None
    log_name: str | None = None
    rank_file: Path | None = None

    @property
    def label(self) -> str:
        if self.role != "worker":
            return f"{self.role} {self.index}"
        rank = self.rank()
        if rank is None:
            return f"worker {self.index} (launch slot {self.index}; before joining the kvstore)"
        return f"worker rank {rank}"

    def rank(self) -> int | None:
        try:
            return int(self.rank_file.read_text()) if self.rank_file else None
        except (OSError, ValueError):
            return None


def dmlc_env(spec: LaunchSpec, role: str, base: dict[str, str], host: str) -> dict[str, str]:
    """The ps-lite variables of one process of this node."""
    env = {
        **launched_env(base),
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": spec.master_addr,
        "DMLC_PS_ROOT_PORT": str(spec.master_port),
        "DMLC_NUM_WORKER": str(spec.world_size),
        "DMLC_NUM_SERVER": str(spec.num_servers * spec.nnodes),
        "DMLC_NODE_HOST": host,  # ps-lite otherwise guesses an interface (fails on loopback)
        "POLYTRAIN_LOCAL_WORLD_SIZE": str(spec.nproc_per_node),
    }
    if role != "worker":  # scheduler and servers only relay and add: one thread each
        env.update(OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1")
    return env


def _start(
    role: str, index: int, cmd: list[str], env: dict[str, str], log_path: Path | None
) -> _Proc:
    log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - closed by the supervisor
    popen = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
        start_new_session=True, preexec_fn=die_with_parent,
    )  # fmt: skip
    return _Proc(role, index, popen, log, log_path.name if log_path else None)


def wait_for_scheduler(spec: LaunchSpec) -> None:
    """Nodes other than 0: wait until the scheduler's port answers, or fail clearly."""
    wait_for_master(spec, "The MXNet scheduler")


class ParameterServerLauncher(Launcher):
    """Scheduler, servers and workers of one node, started and supervised here."""

    backend = "mxnet"
    name = "ps-lite"
    environment = DMLCEnvironment()

    def launch(self, spec: LaunchSpec, env: dict[str, str], address: str) -> int:
        return launch_parameter_server(spec, env, address)


def launch_parameter_server(spec: LaunchSpec, base_env: dict[str, str], host: str) -> int:
    """Start this node's scheduler/servers/workers, wait for the workers, clean up."""
    if spec.node_rank > 0:
        wait_for_scheduler(spec)
    log_dir = Path(spec.log_dir) if spec.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    rank_dir = Path(tempfile.mkdtemp(prefix="polytrain-ranks-"))

    def log(name: str) -> Path | None:
        return log_dir / name if log_dir else None

    import_mxnet = [sys.executable, "-c", "import mxnet"]
    procs: list[_Proc] = []
    try:
        if spec.node_rank == 0:
            env = dmlc_env(spec, "scheduler", base_env, host)
            procs.append(_start("scheduler", 0, import_mxnet, env, log("schedulerlog")))
        for i in range(spec.num_servers):
            index = spec.node_rank * spec.num_servers + i
            env = dmlc_env(spec, "server", base_env, host)
            procs.append(_start("server", index, import_mxnet, env, log(f"serverlog.{index}")))
        workers = []
        for i in range(spec.nproc_per_node):
            slot = spec.node_rank * spec.nproc_per_node + i
            env = dmlc_env(spec, "worker", base_env, host)
            env["POLYTRAIN_RANK"] = str(slot)  # provisional; the kvstore assigns the real rank
            env["POLYTRAIN_LOCAL_RANK"] = str(i)
            env[RANK_FILE_VAR] = str(rank_dir / f"slot{slot}")
            env[PROGRESS_DIR_VAR] = str(rank_dir)  # the workers' heartbeats
            cmd = python_command(spec.command)
            worker = _start("worker", slot, cmd, env, log(f"workerlog.slot{slot}"))
            worker.rank_file = rank_dir / f"slot{slot}"
            workers.append(worker)
            procs.append(worker)
        return _wait_stoppable(procs, workers, spec, rank_dir)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):  # with anything it started
                os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()
            if p.log:
                p.log.close()
            if p.role == "worker":
                _name_log_by_rank(p, spec)
        shutil.rmtree(rank_dir, ignore_errors=True)


class _Stopped(Exception):
    """A second SIGINT or SIGTERM reached the launcher."""


@dataclass
class _Stop:
    """The first SIGINT/SIGTERM: passed on to the workers, which stop and save."""

    workers: list[_Proc]
    signal: int = 0
    since: float = 0.0

    def request(self, signum: int, _frame: object) -> None:
        if self.signal:
            raise _Stopped(signum)
        self.signal, self.since = signum, time.monotonic()
        for w in self.workers:
            if w.popen.poll() is None:
                os.kill(w.popen.pid, signum)

    def overdue(self) -> bool:
        return bool(self.signal) and time.monotonic() - self.since > STOP_GRACE_SECONDS

    def code(self, failure: int) -> int:
        """A stop ends with 128 + its signal, whatever happened on the way."""
        return 128 + self.signal if self.signal else failure


def _wait_stoppable(
    procs: list[_Proc], workers: list[_Proc], spec: LaunchSpec, progress: Path
) -> int:
    """:func:`_wait`, with SIGINT/SIGTERM passed on to the workers (:class:`_Stop`)."""
    stop = _Stop(workers)
    old = {s: signal.signal(s, stop.request) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _wait(procs, workers, spec, stop, progress)
    except _Stopped as exc:
        _terminate(procs)
        print(f"polytrain launch: stopped by {signal_name(int(exc.args[0]))}, twice: every "
              "process of this node was ended at once.", file=sys.stderr)  # fmt: skip
        return 128 + stop.signal
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _wait(
    procs: list[_Proc], workers: list[_Proc], spec: LaunchSpec, stop: _Stop, progress: Path
) -> int:
    while True:
        for w in workers:
            _name_log_by_rank(w, spec)
        for p in procs:
            code = p.popen.poll()
            if code is None or code == 0 or (p.role == "worker" and obeyed(code, stop.signal)):
                continue
            rank = p.rank() if p.role == "worker" else None
            stall = after_stall(progress, time.time(), -1 if rank is None else rank)
            full = f" ({why})" if (why := full_log_dir(spec.log_dir)) else ""
            print(
                f"polytrain launch: {p.label} (pid {p.popen.pid}) failed first: "
                f"{ending(code)}{stall}{full}; "
                "stopping the other processes of this node.",
                file=sys.stderr,
            )
            _terminate(procs)
            if p.log_name:
                print_log_tail(spec.log_dir, p.log_name)
            return stop.code(code if code > 0 else 128 - code)
        if all(w.popen.poll() is not None for w in workers):
            break
        if stop.overdue():
            _terminate(procs)
            print(f"polytrain launch: stopped by {signal_name(stop.signal)}; the workers did "
                  f"not end within {STOP_GRACE_SECONDS:.0f} s and were killed.",
                  file=sys.stderr)  # fmt: skip
            return stop.code(0)
        time.sleep(POLL_SECONDS)
    # servers leave when every worker has left the kvstore
    deadline = time.monotonic() + (TERMINATE_SECONDS if stop.signal else SERVER_EXIT_SECONDS)
    while any(p.popen.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    if stop.signal:
        print(f"polytrain launch: stopped by {signal_name(stop.signal)}; {len(workers)} "
              "worker(s) of this node stopped and exited; ps-lite ended.",
              file=sys.stderr)  # fmt: skip
    return stop.code(0)


def _name_log_by_rank(worker: _Proc, spec: LaunchSpec) -> None:
    """workerlog.slot<N> -> workerlog.<rank> once the worker knows its rank (the open
    file keeps receiving the output)."""
    if (
        spec.log_dir is None
        or worker.log_name is None
        or not worker.log_name.startswith("workerlog.slot")
    ):
        return
    rank = worker.rank()
    if rank is not None:
        new = f"workerlog.{rank}"
        Path(spec.log_dir, worker.log_name).replace(Path(spec.log_dir, new))
        worker.log_name = new


def _terminate(procs: list[_Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.terminate()
    deadline = time.monotonic() + TERMINATE_SECONDS
    while any(p.popen.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
