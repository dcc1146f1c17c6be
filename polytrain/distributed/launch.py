"""``polytrain launch``: several processes (and machines) through each framework's own engine.

* torch: ``torch.distributed.run`` (torchrun), static rendezvous at ``--master``;
* paddle: ``paddle.distributed.launch`` (never ``--devices`` on CPU: it fails there; no
  restarts: a failed worker fails the job);
* mxnet: the parameter server of ps-lite: a scheduler, servers and workers started here
  with the ``DMLC_*`` variables (MXNet ships no launcher in its wheel), :mod:`.ps_launch`.

Before anything starts, the launcher checks what it can see from its own node: node 0 must
be able to listen on the master port (a port in use is an error now, not a hang later),
and the address this node uses towards the master is read from the routing table and
handed to the engines (``GLOO_SOCKET_IFNAME`` for the gloo of torch and Paddle, Paddle's
``--host``, MXNet's ``DMLC_NODE_HOST``): with several interfaces, or in a network
namespace, the host name often resolves to an address the other nodes cannot reach.

Timeouts: the engine's launcher must start this node's workers within ``--timeout``
seconds (the launchers of all nodes meet first; Paddle's would wait for missing peers
forever), then the workers bound their own rendezvous and every collective
(``polytrain train --timeout``). Worker output goes to ``LOG_DIR/workerlog.<rank>``. If a
worker dies the engine stops the others; the exit code is non-zero and the failed rank
is named, with the end of its log.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polytrain.distributed.cluster import LAUNCH_WORLD_VAR
from polytrain.distributed.worker_log import read_statuses
from polytrain.errors import ClusterError, ConfigError
from polytrain.utils.threads import cpu_count

GRACE_SECONDS = 5.0
POLL_SECONDS = 0.2
LOG_TAIL_LINES = 8


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
    host: str | None = None  # this node's address as the others reach it (default: routed)
    timeout: float = 300.0  # for the engine's launchers to meet and start the workers
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("Give the command to run after '--', e.g. -- polytrain train ...")
        if self.nproc_per_node < 1 or self.nnodes < 1 or self.num_servers < 1:
            raise ConfigError("--nproc-per-node, --nnodes and --num-servers must be >= 1.")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1} "
                f"(--nnodes {self.nnodes})."
            )
        host, _, port = self.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--master must be HOST:PORT, got {self.master!r}.")
        if self.timeout <= 0:
            raise ConfigError(
                f"--timeout must be a positive number of seconds, got {self.timeout}."
            )

    @property
    def master_addr(self) -> str:
        return self.master.rpartition(":")[0].strip("[]")

    @property
    def master_port(self) -> int:
        return int(self.master.rpartition(":")[2])

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


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


WRAPPER = [sys.executable, "-m", "polytrain.distributed.worker_log"]


def _wrapped(spec: LaunchSpec, status_dir: Path, *, log: bool) -> list[str]:
    """The command inside :mod:`polytrain.distributed.worker_log` (per-rank log, exit record)."""
    options = ["--status-dir", str(status_dir)]
    if log and spec.log_dir is not None:
        options += ["--log-dir", spec.log_dir]
    return [*options, "--", *python_command(spec.command)]


def torchrun_command(spec: LaunchSpec, status_dir: Path) -> list[str]:
    """torchrun with a static rendezvous; each worker runs inside the wrapper."""
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
        *WRAPPER, *_wrapped(spec, status_dir, log=True),
    ]  # fmt: skip


def paddle_command(spec: LaunchSpec, status_dir: Path, host: str | None = None) -> list[str]:
    """paddle.distributed.launch running the wrapper (a "training script" not ending in
    .py is run as a command); its own --log_dir writes workerlog.N; no restarts."""
    args = [sys.executable, "-m", "paddle.distributed.launch",
            "--nnodes", str(spec.nnodes), "--nproc_per_node", str(spec.nproc_per_node),
            "--log_dir", spec.log_dir or "log", "--job_id", "polytrain",
            "--max_restart", "0"]  # fmt: skip
    if spec.nnodes > 1:
        args += ["--master", spec.master, "--rank", str(spec.node_rank)]
        if host:  # else Paddle takes the host name's address, often not the routed one
            args += ["--host", host]
    else:
        args += ["--start_port", str(spec.master_port)]
    return [*args, *WRAPPER, *_wrapped(spec, status_dir, log=False)]


# -- checks and addresses ---------------------------------------------------------------------


def check_master_port(spec: LaunchSpec) -> None:
    """On node 0, the master port must be free (node 0 hosts the rendezvous there)."""
    if spec.node_rank != 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no conflict
        try:
            sock.bind((spec.master_addr, spec.master_port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ClusterError(
                    f"Port {spec.master_port} is already in use on this host, the master "
                    f"(node rank 0): another job or a leftover process listens there. Pick "
                    f"a free port, e.g. --master {spec.master_addr}:{free_port()}."
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ClusterError(
                    f"--master {spec.master_addr} is not an address of this host, but node "
                    "rank 0 hosts the rendezvous: run node rank 0 on that host, or give "
                    "this host's address in --master."
                ) from None
            raise ClusterError(
                f"Cannot use the master {spec.master} on this host: {exc}."
            ) from None


def free_port() -> int:
    """A TCP port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def node_address(spec: LaunchSpec) -> str:
    """This node's address towards the master: ``--host``, else the routing table's choice."""
    if spec.host:
        return spec.host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((spec.master_addr, spec.master_port))  # UDP: nothing is sent
            return str(sock.getsockname()[0])
    except OSError as exc:
        raise ClusterError(
            f"The master {spec.master} cannot be reached from this node: "
            f"{exc.strerror or exc}. Check --master, the network, or give this node's "
            "address with --host."
        ) from None


def interface_of(address: str) -> str | None:
    """The network interface holding an IPv4 address (Linux), e.g. ``lo`` for 127.0.0.1."""
    try:
        import fcntl
        import struct

        packed = socket.inet_aton(address)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _, name in socket.if_nameindex():
                request = struct.pack("256s", name.encode()[:15])
                try:
                    reply = fcntl.ioctl(sock.fileno(), 0x8915, request)  # SIOCGIFADDR
                except OSError:
                    continue
                if reply[20:24] == packed:
                    return name
    except (OSError, ImportError):
        return None
    return None


def engine_env(spec: LaunchSpec, address: str) -> dict[str, str]:
    """Variables for every process of this node."""
    env = {LAUNCH_WORLD_VAR: str(spec.world_size), "PYTHONUNBUFFERED": "1"}
    if not (os.environ.get("POLYTRAIN_THREADS") or os.environ.get("OMP_NUM_THREADS")):
        # the node's CPUs shared out, the same for every engine (torchrun alone would say 1)
        env["POLYTRAIN_THREADS"] = str(max(1, cpu_count() // spec.nproc_per_node))
    interface = interface_of(address)
    if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = interface  # gloo otherwise resolves the host name
    return env


def probe_master(spec: LaunchSpec, seconds: float = 2.0) -> str:
    """One connection attempt to the master, described for an error message."""
    try:
        with socket.create_connection((spec.master_addr, spec.master_port), timeout=seconds):
            return f"{spec.master} accepts connections"
    except ConnectionRefusedError:
        return f"nothing listens on {spec.master} (connection refused)"
    except TimeoutError:
        return f"{spec.master} did not answer within {seconds:.0f} s"
    except OSError as exc:
        return f"{spec.master} cannot be reached ({exc.strerror or exc})"


# -- running ----------------------------------------------------------------------------------


def launch(spec: LaunchSpec) -> int:
    """Run one node's share of the job; returns the exit code."""
    if spec.backend not in ("torch", "paddle", "mxnet"):
        raise ConfigError(f"No launcher for backend {spec.backend!r}; use torch, paddle or mxnet.")
    check_master_port(spec)
    address = node_address(spec)
    env = {**os.environ, **engine_env(spec, address), **spec.env}
    if spec.backend == "mxnet":
        from polytrain.distributed.ps_launch import launch_parameter_server

        return launch_parameter_server(spec, env, address)
    with tempfile.TemporaryDirectory(prefix="polytrain-status-") as status:
        if spec.backend == "torch":
            cmd, name, rank_var = torchrun_command(spec, Path(status)), "torchrun", "RANK"
        else:
            cmd = paddle_command(spec, Path(status), address)
            name, rank_var = "paddle.distributed.launch", "PADDLE_TRAINER_ID"
        return _supervise(cmd, env, spec, name, _Workers(Path(status), rank_var))


def _supervise(
    cmd: list[str], env: dict[str, str], spec: LaunchSpec, name: str, workers: _Workers
) -> int:
    """Run a framework launcher: forward SIGINT/SIGTERM, bound its start, report a failure."""
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

    def __init__(self, status_dir: Path, rank_var: str) -> None:
        self.status_dir = status_dir
        self.rank_var = rank_var.encode()
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
                how = f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"
                rank, pid = int(record["rank"]), int(record["pid"])
                return rank, f"worker rank {rank} (pid {pid}) failed first: {how}"
        return None

    def _has_rank(self, pid: int) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return any(item.startswith(self.rank_var + b"=") for item in environ)


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
