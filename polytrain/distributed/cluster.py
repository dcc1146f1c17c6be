"""Which process is this? Read from the launcher's environment variables, no framework needed.

Every launcher states rank and world size in variables of its own. One small
:class:`ClusterEnvironment` per launcher reads them: the engines' own launchers come
with their backend plugins (``Launcher.environment``, collected by
``polytrain.plugins.registry.cluster_environments``), SLURM's srun, mpirun and the
single process are here (:data:`GENERIC_ENVIRONMENTS`). :func:`resolve` tries them in
order and returns the first match as a :class:`ClusterInfo` whose ``reasons`` say what
was read and why (``polytrain env --explain`` prints them).
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from polytrain.errors import ClusterError


@dataclass(frozen=True)
class ClusterInfo:
    """Where this process sits in the job, and how that was worked out."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str | None
    master_port: int | None
    source: str
    reasons: tuple[str, ...] = ()
    role: str = "worker"  # parameter-server jobs: "worker", "server" or "scheduler"
    num_servers: int = 0  # parameter-server jobs only

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1 or self.num_servers > 0


def _show(name: str, value: object) -> str:
    """``RANK=3`` for a variable, ``the number of nodes (3)`` for a worked-out quantity."""
    return f"{name}={value}" if re.fullmatch(r"[A-Z0-9_]+", name) else f"the {name} ({value})"


def check_below(value: int, name: str, limit: int, limit_name: str) -> None:
    """A rank must be below its count; ``name``: a variable, or a worked-out quantity."""
    if value >= limit:
        raise ClusterError(
            f"{_show(name, value)} must be below {_show(limit_name, limit)} (ranks count from 0). "
            "The launcher's variables disagree; if they were exported by hand, fix or unset them."
        )


def parse_port(name: str, value: str) -> int:
    """The TCP port in variable ``name``, or an error naming it."""
    if value.strip().isdigit() and 0 < int(value) < 65536:
        return int(value)
    raise ClusterError(
        f"{name}={value!r} is not a TCP port. Use a free port between 1 and 65535, e.g. 29500."
    )


class VariableReader:
    """Reads one source's variables, remembering each one read for the reasons."""

    def __init__(self, env: Mapping[str, str], source: ClusterEnvironment) -> None:
        self.env, self.source, self.labels = env, source.name, source.labels
        self.present = [v for v in source.variables if v in env]
        self.read: list[str] = []
        self.notes: list[str] = []
        self.found: dict[str, str] = {}  # first name asked for -> name actually read

    def name(self, first: str) -> str:
        return self.found.get(first, first)

    def get(self, *names: str) -> str | None:
        """Value of the first of ``names`` that is set."""
        for name in names:
            if name in self.env:
                self.read.append(f"{name}={self.env[name]}")
                self.found[names[0]] = name
                return self.env[name].strip()
        return None

    def maybe_integer(self, *names: str, minimum: int = 0) -> int | None:
        value = self.get(*names)
        if value is None:
            return None
        name = self.name(names[0])
        if not re.fullmatch(r"[+-]?\d+", value):
            raise ClusterError(f"{name}={value!r} is not an integer; set it to a whole number.")
        if int(value) < minimum:
            raise ClusterError(f"{name}={value} must be at least {minimum}.")
        return int(value)

    def integer(self, *names: str, default: int | None = None, minimum: int = 0) -> int:
        value = self.maybe_integer(*names, minimum=minimum)
        if value is not None:
            return value
        if default is not None:
            return default
        raise ClusterError(
            f"{' or '.join(names)} is not set, but {', '.join(self.present)} is, so this looks "
            f"like a {self.source} launch. Set it, or unset {', '.join(self.present)} to run "
            "as a single process."
        )

    def master(self, world_size: int, world_name: str) -> tuple[str | None, int | None]:
        """MASTER_ADDR and MASTER_PORT, required when there is more than one process."""
        addr = self.get("MASTER_ADDR") or None
        port = self.get("MASTER_PORT")
        if world_size > 1 and (addr is None or port is None):
            raise ClusterError(
                f"{world_name}={world_size} but MASTER_ADDR or MASTER_PORT is not set, so the "
                "processes cannot find rank 0. Export both on every process, e.g. "
                "MASTER_ADDR=<host of rank 0> MASTER_PORT=29500."
            )
        return addr, None if port is None else parse_port("MASTER_PORT", port)

    def info(
        self,
        rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: int,
        node_rank: int,
        num_nodes: int,
        master: tuple[str | None, int | None],
    ) -> ClusterInfo:
        """Check the numbers fit together (the source's ``labels`` name them) and build."""
        generic = (
            "rank",
            "world size",
            "local rank",
            "local world size",
            "node rank",
            "number of nodes",
        )
        pairs = zip(self.labels.split(), generic, strict=True)
        labels = [self.name(v) if v in self.found else g for v, g in pairs]
        n_rank, n_world, n_local, n_local_world, n_node, n_nodes = labels
        check_below(rank, n_rank, world_size, n_world)
        check_below(local_rank, n_local, local_world_size, n_local_world)
        if local_world_size > world_size:
            raise ClusterError(
                f"{_show(n_local_world, local_world_size)} is more than "
                f"{_show(n_world, world_size)}: a node cannot hold more processes than the job."
            )
        check_below(node_rank, n_node, num_nodes, n_nodes)
        read = f"; read {', '.join(self.read)}" if self.read else ""
        return ClusterInfo(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=master[0],
            master_port=master[1],
            source=self.source,
            reasons=(f"{self.source}: chosen{read}", *self.notes),
        )


def read_rank_variables(r: VariableReader, labels: str) -> ClusterInfo:
    """torchrun's layout of variables, under the six names ``labels`` gives (rank, world
    size, local rank, local world size, node rank, node count): world size and rank
    required, the others worked out when unset, MASTER_ADDR/PORT for several processes."""
    rank_v, world_v, local_v, local_world_v, node_v, nodes_v = labels.split()
    world = r.integer(world_v, minimum=1)
    rank = r.integer(rank_v)
    local_world = r.integer(local_world_v, default=world, minimum=1)
    local_rank = r.integer(local_v, default=rank % local_world)
    node_rank = r.integer(node_v, default=rank // local_world)
    nodes = r.integer(nodes_v, default=-(-world // local_world), minimum=1)
    return r.info(rank, world, local_rank, local_world, node_rank, nodes, r.master(world, world_v))


class ClusterEnvironment(ABC):
    """One launcher. ``detect`` returns None unless one of its ``variables`` is set."""

    name: ClassVar[str]
    variables: ClassVar[tuple[str, ...]]  # any one of these set means this launcher ran us
    # Variables that hold rank, world size, local rank, local world size, node rank and node
    # count, to name them in errors; "-" where the value is always worked out, not read.
    labels: ClassVar[str] = "- - - - - -"

    def detect(self, env: Mapping[str, str]) -> ClusterInfo | None:
        if not any(v in env for v in self.variables):
            return None
        return self.read_info(VariableReader(env, self))

    def why_absent(self, env: Mapping[str, str]) -> str:
        return f"{self.name}: skipped, none of {', '.join(self.variables)} is set"

    @abstractmethod
    def read_info(self, r: VariableReader) -> ClusterInfo:
        """Read and check the variables; raise ClusterError if they are inconsistent."""


def expand_hostlist(hostlist: str, name: str = "hostlist") -> list[str]:
    """Expand SLURM's compact host list: ``node[01-02,07],gpu5`` -> node01 node02 node07 gpu5."""
    hosts: list[str] = []
    for item in re.split(r",(?![^\[]*\])", hostlist):  # commas outside brackets
        hosts.extend(_expand_host(item.strip(), name, hostlist))
    return hosts


def _expand_host(item: str, name: str, whole: str) -> list[str]:
    bad = ClusterError(
        f"{name}={whole!r} is not a SLURM host list (expected e.g. node[01-03,07],gpu5); "
        "export MASTER_ADDR to skip reading it."
    )
    match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]*)\](.*)", item)
    if match is None:
        if not item or "[" in item or "]" in item:
            raise bad
        return [item]
    prefix, ranges, rest = match.groups()
    tails = _expand_host(rest, name, whole) if rest else [""]
    hosts: list[str] = []
    for part in ranges.split(","):
        low, dash, high = part.partition("-")
        high = high if dash else low
        if not (low.isdigit() and high.isdigit() and int(low) <= int(high)):
            raise bad
        for number in range(int(low), int(high) + 1):
            hosts.extend(f"{prefix}{number:0{len(low)}d}{tail}" for tail in tails)
    return hosts


def _tasks_per_node(name: str, value: str) -> list[int]:
    """SLURM's compressed counts: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ClusterError(
                f"{name}={value!r} is not SLURM's tasks-per-node form, e.g. 2(x3),1."
            )
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


class SLURMEnvironment(ClusterEnvironment):
    name = "slurm"
    variables = ("SLURM_PROCID",)  # set by srun for each task; salloc alone does not set it
    labels = "SLURM_PROCID SLURM_STEP_NUM_TASKS SLURM_LOCALID - SLURM_NODEID SLURM_STEP_NUM_NODES"

    def why_absent(self, env: Mapping[str, str]) -> str:
        job = env.get("SLURM_JOB_ID", env.get("SLURM_JOBID"))
        if job is None:
            return super().why_absent(env)
        return (
            f"slurm: skipped, inside a SLURM allocation (job {job}) but not an srun step "
            "(SLURM_PROCID is not set); launch with srun to run one task per process"
        )

    def read_info(self, r: VariableReader) -> ClusterInfo:
        # Step-level variables first: after salloc, job-level ones describe the allocation,
        # not the srun step this process belongs to.
        rank = r.integer("SLURM_PROCID")
        world = r.integer("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", minimum=1)
        nodes = r.integer("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", minimum=1)
        local = r.integer("SLURM_LOCALID")
        node_rank = r.integer("SLURM_NODEID")
        job_tasks = r.env.get("SLURM_NTASKS")
        stepped = r.name("SLURM_STEP_NUM_TASKS") == "SLURM_STEP_NUM_TASKS"
        if stepped and job_tasks is not None and job_tasks.strip() != str(world):
            r.notes.append(
                f"slurm: job-level SLURM_NTASKS={job_tasks} differs from this srun "
                f"step's SLURM_STEP_NUM_TASKS={world}; the step's count is used"
            )
        check_below(node_rank, "SLURM_NODEID", nodes, r.name("SLURM_STEP_NUM_NODES"))
        per_node_value = r.get("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
        if per_node_value is None:
            raise ClusterError(
                "SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE are not set; "
                "srun sets them for every task: run this inside srun."
            )
        per_node_name = r.name("SLURM_STEP_TASKS_PER_NODE")
        per_node = _tasks_per_node(per_node_name, per_node_value)
        if len(per_node) != nodes or sum(per_node) != world:
            raise ClusterError(
                f"{per_node_name}={per_node_value!r} gives {sum(per_node)} tasks on "
                f"{len(per_node)} nodes, but {r.name('SLURM_STEP_NUM_TASKS')}={world} and "
                f"{r.name('SLURM_STEP_NUM_NODES')}={nodes}. The SLURM variables disagree."
            )
        master = self._master(r, world)
        return r.info(rank, world, local, per_node[node_rank], node_rank, nodes, master)

    def _master(self, r: VariableReader, world: int) -> tuple[str | None, int | None]:
        addr = r.get("MASTER_ADDR") or None
        if addr is None:
            nodelist = r.get("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
            if nodelist is not None:
                addr = expand_hostlist(nodelist, r.name("SLURM_STEP_NODELIST"))[0]
                r.notes.append(
                    f"slurm: master is the first host of {r.name('SLURM_STEP_NODELIST')}: {addr}"
                )
        port_value = r.get("MASTER_PORT")
        port = None if port_value is None else parse_port("MASTER_PORT", port_value)
        job_id = None if port is not None else r.maybe_integer("SLURM_JOB_ID", "SLURM_JOBID")
        if job_id is not None:
            port = 15000 + job_id % 5000  # same on every task of the job, unlikely to collide
            r.notes.append(f"slurm: master port {port} derived from the job id (15000 + id % 5000)")
        if world > 1 and (addr is None or port is None):
            raise ClusterError(
                "srun step with more than one task but no master address or port: neither "
                "MASTER_ADDR/MASTER_PORT nor SLURM_STEP_NODELIST/SLURM_JOB_ID give one. Export "
                "MASTER_ADDR=<first node> MASTER_PORT=29500."
            )
        return addr, port


class _MPIEnvironment(ClusterEnvironment):
    """mpirun-style launchers: rank and local rank, no node index, no master address."""

    def read_info(self, r: VariableReader) -> ClusterInfo:
        rank_var, size_var, local_rank_var, local_size_var = self.labels.split()[:4]
        rank = r.integer(rank_var)
        world = r.integer(size_var, minimum=1)
        local = r.integer(local_rank_var)
        local_world = r.integer(local_size_var, minimum=1)
        r.notes.append(
            f"{self.name}: node rank assumes consecutive ranks share a node "
            "(mpirun's default by-slot mapping)"
        )
        nodes = -(-world // local_world)
        master = r.master(world, size_var)
        return r.info(rank, world, local, local_world, rank // local_world, nodes, master)


class OpenMPIEnvironment(_MPIEnvironment):
    name = "openmpi"
    variables = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
    labels = (
        "OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK "
        "OMPI_COMM_WORLD_LOCAL_SIZE - -"
    )


class PMIEnvironment(_MPIEnvironment):
    name = "pmi"
    variables = ("PMI_RANK", "PMI_SIZE")
    labels = "PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS - -"


class SingleProcessEnvironment(ClusterEnvironment):
    name = "single"
    variables = ()

    def detect(self, env: Mapping[str, str]) -> ClusterInfo:
        return self.read_info(VariableReader(env, self))

    def read_info(self, r: VariableReader) -> ClusterInfo:
        r.notes.append("single: no launcher variables found; running as one process")
        return r.info(0, 1, 0, 1, 0, 1, (None, None))


# After the engines' own launchers, which come first: a launcher's variables beat the
# scheduler it runs under (`srun <launcher>` leaves SLURM_PROCID naming the launcher's agent,
# not the worker). SLURM beats MPI because srun's PMI plugins may also set PMI_*. MPI last:
# its variables say nothing about the master. Single process when nothing matched.
GENERIC_ENVIRONMENTS: tuple[ClusterEnvironment, ...] = (
    SLURMEnvironment(),
    OpenMPIEnvironment(),
    PMIEnvironment(),
    SingleProcessEnvironment(),
)


def precedence(environments: Sequence[ClusterEnvironment]) -> tuple[ClusterEnvironment, ...]:
    """The order :func:`resolve` tries: the launchers' ``environments``, then the generic ones."""
    return (*environments, *GENERIC_ENVIRONMENTS)


def _also_present(winner: ClusterInfo, other: ClusterEnvironment, env: Mapping[str, str]) -> str:
    try:
        info = other.detect(env)
    except ClusterError as err:
        return f"{other.name}: also set but ignored ({winner.source} comes first); invalid: {err}"
    if info is None or isinstance(other, SingleProcessEnvironment):
        return ""
    if info.world_size != winner.world_size:
        return (
            f"{other.name}: also set and says world size {info.world_size}, not "
            f"{winner.world_size}; {winner.source} wins because it comes first"
        )
    return f"{other.name}: also set and agrees (world size {info.world_size}); ignored"


def resolve(
    env: Mapping[str, str] | None = None, *, environments: Sequence[ClusterEnvironment]
) -> ClusterInfo:
    """The first of :func:`precedence` that matches ``env`` (default os.environ).

    ``environments``: those of the registered launchers
    (``polytrain.plugins.registry.cluster_environments()``); without them a process
    started by an engine's launcher would look like a single process.
    """
    env = os.environ if env is None else env
    ordered = precedence(environments)
    skipped = []
    for i, environment in enumerate(ordered):
        info = environment.detect(env)
        if info is None:
            skipped.append(environment.why_absent(env))
            continue
        later = [_also_present(info, other, env) for other in ordered[i + 1 :]]
        _check_launch_world(info, env)
        return replace(info, reasons=(*info.reasons, *skipped, *filter(None, later)))
    raise AssertionError("unreachable: SingleProcessEnvironment always matches")


# Set by `polytrain launch` for every process it starts: the world size that node was asked
# for. Launchers of different nodes given different sizes may still form a job (some
# engines do, with their own count); this says so instead of training a job nobody asked for.
LAUNCH_WORLD_VAR = "POLYTRAIN_LAUNCH_WORLD_SIZE"


def _check_launch_world(info: ClusterInfo, env: Mapping[str, str]) -> None:
    asked = env.get(LAUNCH_WORLD_VAR, "").strip()
    if info.role == "worker" and asked.isdigit() and int(asked) != info.world_size:
        raise ClusterError(
            f"Mismatched world sizes: polytrain launch on this node was asked for {asked} "
            f"processes in all (--nnodes x --nproc-per-node), but {info.source} formed a job "
            f"of {info.world_size}. Give every node the same --nnodes and --nproc-per-node."
        )


def explain(info: ClusterInfo) -> str:
    """Multi-line report for ``polytrain env --explain``."""
    master = "none" if info.master_addr is None else f"{info.master_addr}:{info.master_port}"
    lines = [
        f"rank:             {info.rank}",
        f"local rank:       {info.local_rank}",
        f"world size:       {info.world_size}",
        f"local world size: {info.local_world_size}",
        f"node rank/nodes:  {info.node_rank}/{info.num_nodes}",
        f"master:           {master}",
        f"source:           {info.source}",
    ]
    if info.num_servers:
        lines.append(f"role:             {info.role} ({info.num_servers} servers)")
    return "\n".join([*lines, "reasons:", *(f"  - {reason}" for reason in info.reasons)])
