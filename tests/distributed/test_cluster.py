"""polytrain.distributed.cluster: every launcher's variables, their precedence, and every error.

The engines' own launchers' environments come from the installed backend plugins
(``cluster_environments()``), exactly as ``polytrain train`` and ``polytrain env`` get them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

import pytest

from polytrain.distributed import cluster
from polytrain.distributed.cluster import ClusterInfo, expand_hostlist, explain, precedence
from polytrain.errors import ClusterError
from polytrain.plugins.registry import cluster_environments

ENVIRONMENTS = cluster_environments()


def resolve(env: Mapping[str, str] | None = None) -> ClusterInfo:
    return cluster.resolve(env, environments=ENVIRONMENTS)


def topology(info: ClusterInfo) -> tuple[object, ...]:
    """(rank, local_rank, world, local_world, node_rank, nodes, master_addr, master_port, source)"""
    return (
        info.rank,
        info.local_rank,
        info.world_size,
        info.local_world_size,
        info.node_rank,
        info.num_nodes,
        info.master_addr,
        info.master_port,
        info.source,
    )


TORCHRUN = {  # rank 3 of a 2-node x 2-process torchrun job, on node 1
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}
PADDLE = {  # trainer 3 of 4, two per host
    "PADDLE_TRAINER_ID": "3",
    "PADDLE_TRAINERS_NUM": "4",
    "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171",
    "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6171",
}
DMLC = {
    "DMLC_ROLE": "worker",
    "DMLC_PS_ROOT_URI": "127.0.0.1",
    "DMLC_PS_ROOT_PORT": "9091",
    "DMLC_NUM_WORKER": "2",
    "DMLC_NUM_SERVER": "1",
}
SLURM_STEP = {  # task 3 of `srun -N2 --ntasks-per-node=2`, on the second node
    "SLURM_JOB_ID": "123456",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "node[07-08]",
    "SLURM_JOB_NODELIST": "node[07-08]",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "MASTER_ADDR": "host0",
    "MASTER_PORT": "29501",
}
PMI = {
    "PMI_RANK": "2",
    "PMI_SIZE": "3",
    "MPI_LOCALRANKID": "0",
    "MPI_LOCALNRANKS": "1",
    "MASTER_ADDR": "host0",
    "MASTER_PORT": "29502",
}


def test_order_of_environments() -> None:
    names = tuple(e.name for e in precedence(ENVIRONMENTS))
    assert names == ("torchrun", "paddle", "dmlc", "jax", "slurm", "openmpi", "pmi", "single")


def test_jax_spawners_variables() -> None:
    """What polytrain.distributed.spawn sets for a jax worker (the jax plugin's launcher)."""
    env = {"POLYTRAIN_JAX_RANK": "3", "POLYTRAIN_JAX_WORLD_SIZE": "4",
           "POLYTRAIN_JAX_LOCAL_RANK": "1", "POLYTRAIN_JAX_LOCAL_WORLD_SIZE": "2",
           "POLYTRAIN_JAX_NODE_RANK": "1", "POLYTRAIN_JAX_NNODES": "2",
           "MASTER_ADDR": "host0", "MASTER_PORT": "29500"}  # fmt: skip
    assert topology(resolve(env)) == (3, 1, 4, 2, 1, 2, "host0", 29500, "jax")


def test_without_the_launchers_environments_their_variables_are_not_read() -> None:
    info = cluster.resolve(TORCHRUN, environments=())
    assert info.source == "single"
    assert not any("torchrun" in reason for reason in info.reasons)


# --- each source -------------------------------------------------------------------------


def test_torchrun_two_by_two_node_one() -> None:
    info = resolve(TORCHRUN)
    assert topology(info) == (3, 1, 4, 2, 1, 2, "10.0.0.1", 29500, "torchrun")
    assert info.is_distributed
    assert info.reasons[0] == (
        "torchrun: chosen; read WORLD_SIZE=4, RANK=3, LOCAL_WORLD_SIZE=2, LOCAL_RANK=1, "
        "GROUP_RANK=1, MASTER_ADDR=10.0.0.1, MASTER_PORT=29500"
    )
    assert info.reasons[1:] == ()  # nothing skipped, nothing else present


def test_torchrun_minimal_env_init_derives_local_values() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
    assert topology(resolve(env)) == (1, 1, 2, 2, 0, 1, "127.0.0.1", 1234, "torchrun")


def test_paddle_four_endpoints_on_two_hosts() -> None:
    info = resolve(PADDLE)
    assert topology(info) == (3, 1, 4, 2, 1, 2, "10.0.0.1", 6170, "paddle")
    assert "torchrun: skipped, none of RANK, WORLD_SIZE is set" in info.reasons
    assert "paddle: master is the first endpoint; local rank counts endpoints on host 10.0.0.2" in (
        info.reasons
    )


@pytest.mark.parametrize(("trainer", "expected"), [(0, (0, 0)), (1, (1, 0)), (2, (0, 1))])
def test_paddle_local_and_node_rank_per_trainer(trainer: int, expected: tuple[int, int]) -> None:
    env = {**PADDLE, "PADDLE_TRAINER_ID": str(trainer)}
    env["PADDLE_CURRENT_ENDPOINT"] = env["PADDLE_TRAINER_ENDPOINTS"].split(",")[trainer]
    info = resolve(env)
    assert (info.local_rank, info.node_rank) == expected


def test_paddle_rank_in_node_is_read_when_given() -> None:
    info = resolve(
        {
            **PADDLE,
            "PADDLE_TRAINER_ID": "2",
            "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6170",
            "PADDLE_RANK_IN_NODE": "1",
        }
    )
    assert info.local_rank == 1
    assert "PADDLE_RANK_IN_NODE=1" in info.reasons[0]


def test_paddle_ipv6_endpoints() -> None:
    env = {
        "PADDLE_TRAINER_ID": "1",
        "PADDLE_TRAINERS_NUM": "2",
        "PADDLE_TRAINER_ENDPOINTS": "[::1]:6170,[::1]:6171",
    }
    assert topology(resolve(env)) == (1, 1, 2, 2, 0, 1, "::1", 6170, "paddle")


def test_paddle_single_trainer_needs_no_endpoints() -> None:
    info = resolve({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "1"})
    assert topology(info) == (0, 0, 1, 1, 0, 1, None, None, "paddle")
    assert not info.is_distributed


def test_dmlc_worker_with_provisional_rank() -> None:
    info = resolve(DMLC)
    assert topology(info) == (0, 0, 2, 2, 0, 1, "127.0.0.1", 9091, "dmlc")
    assert (info.role, info.num_servers, info.is_distributed) == ("worker", 1, True)
    assert (
        "dmlc: provisional rank 0 (no POLYTRAIN_RANK); the scheduler assigns the real one when "
        "the kvstore is created"
    ) in info.reasons


def test_dmlc_worker_rank_from_launcher() -> None:
    info = resolve({**DMLC, "POLYTRAIN_RANK": "1"})
    assert (info.rank, info.local_rank) == (1, 1)
    assert any(r.startswith("dmlc: provisional rank from POLYTRAIN_RANK") for r in info.reasons)


@pytest.mark.parametrize("role", ["server", "scheduler"])
def test_dmlc_server_and_scheduler(role: str) -> None:
    info = resolve({**DMLC, "DMLC_ROLE": role, "POLYTRAIN_RANK": "1"})
    assert topology(info) == (0, 0, 2, 2, 0, 1, "127.0.0.1", 9091, "dmlc")
    assert (info.role, info.num_servers, info.is_distributed) == (role, 1, True)
    assert f"dmlc: this process is a {role}, not a worker; ranks are placeholders" in info.reasons


def test_dmlc_with_one_worker_is_still_distributed() -> None:
    info = resolve({**DMLC, "DMLC_NUM_WORKER": "1"})
    assert (info.world_size, info.num_servers, info.is_distributed) == (1, 1, True)


def test_slurm_step_two_nodes_two_tasks_each() -> None:
    info = resolve(SLURM_STEP)
    assert topology(info) == (3, 1, 4, 2, 1, 2, "node07", 15000 + 123456 % 5000, "slurm")
    assert info.master_port == 18456
    assert "slurm: master is the first host of SLURM_STEP_NODELIST: node07" in info.reasons
    assert "slurm: master port 18456 derived from the job id (15000 + id % 5000)" in info.reasons


@pytest.mark.parametrize(("node", "local_world"), [(0, 2), (2, 2), (3, 1)])
def test_slurm_uneven_tasks_per_node(node: int, local_world: int) -> None:
    env = {
        **SLURM_STEP,
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_STEP_NUM_NODES": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(2 * node),
        "SLURM_LOCALID": "0",
    }
    info = resolve(env)
    assert (info.world_size, info.num_nodes, info.local_world_size) == (7, 4, local_world)


def test_salloc_then_srun_step_counts_win_over_job_counts() -> None:
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_NTASKS": "8",
        "SLURM_NNODES": "2",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "SLURM_JOB_NODELIST": "node[01-02]",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_NODELIST": "node[01-02]",
    }
    info = resolve(env)
    assert topology(info) == (1, 0, 2, 1, 1, 2, "node01", 15077, "slurm")
    assert (
        "slurm: job-level SLURM_NTASKS=8 differs from this srun step's SLURM_STEP_NUM_TASKS=2; "
        "the step's count is used"
    ) in info.reasons


def test_salloc_shell_without_srun_is_single_process() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "node[01-02]"}
    info = resolve(env)
    assert topology(info) == (0, 0, 1, 1, 0, 1, None, None, "single")
    assert not info.is_distributed
    assert (
        "slurm: skipped, inside a SLURM allocation (job 77) but not an srun step (SLURM_PROCID "
        "is not set); launch with srun to run one task per process"
    ) in info.reasons


def test_slurm_master_addr_and_port_override() -> None:
    info = resolve({**SLURM_STEP, "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "12345"})
    assert (info.master_addr, info.master_port) == ("10.9.9.9", 12345)
    assert not any("derived from the job id" in r for r in info.reasons)


def test_slurm_job_level_fallbacks() -> None:
    env = {
        "SLURM_JOBID": "5",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_NODELIST": "gpu5",
    }
    assert topology(resolve(env)) == (0, 0, 2, 2, 0, 1, "gpu5", 15005, "slurm")


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("gpu5", ["gpu5"]),
        ("a1,b2", ["a1", "b2"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("node[3]-ib,x", ["node3-ib", "x"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_openmpi() -> None:
    info = resolve(OPENMPI)
    assert topology(info) == (5, 1, 8, 4, 1, 2, "host0", 29501, "openmpi")
    assert (
        "openmpi: node rank assumes consecutive ranks share a node (mpirun's default by-slot "
        "mapping)"
    ) in info.reasons


def test_pmi() -> None:
    assert topology(resolve(PMI)) == (2, 0, 3, 1, 2, 3, "host0", 29502, "pmi")


def test_single_process() -> None:
    info = resolve({})
    assert topology(info) == (0, 0, 1, 1, 0, 1, None, None, "single")
    assert not info.is_distributed
    assert info.reasons == (
        "single: chosen",
        "single: no launcher variables found; running as one process",
        "torchrun: skipped, none of RANK, WORLD_SIZE is set",
        "paddle: skipped, none of PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, "
        "PADDLE_TRAINER_ENDPOINTS is set",
        "dmlc: skipped, none of DMLC_ROLE is set",
        "jax: skipped, none of POLYTRAIN_JAX_RANK is set",
        "slurm: skipped, none of SLURM_PROCID is set",
        "openmpi: skipped, none of OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE is set",
        "pmi: skipped, none of PMI_RANK, PMI_SIZE is set",
    )


def test_resolve_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", {**PMI})
    assert topology(resolve()) == (2, 0, 3, 1, 2, 3, "host0", 29502, "pmi")


# --- precedence --------------------------------------------------------------------------


def test_torchrun_inside_slurm_wins_and_says_so() -> None:
    # `srun -N2 torchrun --nproc-per-node=2`: SLURM sees 2 tasks (the agents), torchrun 4.
    env = {
        **SLURM_STEP,
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        **TORCHRUN,
    }
    info = resolve(env)
    assert topology(info) == (3, 1, 4, 2, 1, 2, "10.0.0.1", 29500, "torchrun")
    assert info.reasons[1:] == (
        "slurm: also set and says world size 2, not 4; torchrun wins because it comes first",
    )


def test_later_source_that_agrees_is_noted() -> None:
    env = {
        **OPENMPI,
        "PMI_RANK": "5",
        "PMI_SIZE": "8",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "4",
    }
    info = resolve(env)
    assert info.source == "openmpi"
    assert info.reasons[-1] == "pmi: also set and agrees (world size 8); ignored"


def test_later_source_that_is_broken_does_not_stop_the_winner() -> None:
    info = resolve({**TORCHRUN, "PMI_RANK": "x"})
    assert info.source == "torchrun"
    assert info.reasons[-1].startswith("pmi: also set but ignored (torchrun comes first); invalid:")
    assert "PMI_RANK='x' is not an integer" in info.reasons[-1]


def test_explain() -> None:
    text = explain(resolve(TORCHRUN))
    assert text.splitlines()[:9] == [
        "rank:             3",
        "local rank:       1",
        "world size:       4",
        "local world size: 2",
        "node rank/nodes:  1/2",
        "master:           10.0.0.1:29500",
        "source:           torchrun",
        "reasons:",
        "  - torchrun: chosen; read WORLD_SIZE=4, RANK=3, LOCAL_WORLD_SIZE=2, LOCAL_RANK=1, "
        "GROUP_RANK=1, MASTER_ADDR=10.0.0.1, MASTER_PORT=29500",
    ]
    assert "role:             server (1 servers)" in explain(
        resolve({**DMLC, "DMLC_ROLE": "server"})
    )
    assert "master:           none" in explain(resolve({}))


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # rank >= world size
        ({**TORCHRUN, "RANK": "4"}, "RANK=4 must be below WORLD_SIZE=4"),
        (
            {**PADDLE, "PADDLE_TRAINER_ID": "4"},
            "PADDLE_TRAINER_ID=4 must be below PADDLE_TRAINERS_NUM=4",
        ),
        ({**DMLC, "POLYTRAIN_RANK": "2"}, "POLYTRAIN_RANK=2 must be below DMLC_NUM_WORKER=2"),
        (
            {**SLURM_STEP, "SLURM_PROCID": "4"},
            "SLURM_PROCID=4 must be below SLURM_STEP_NUM_TASKS=4",
        ),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_RANK": "8"},
            "OMPI_COMM_WORLD_RANK=8 must be below OMPI_COMM_WORLD_SIZE=8",
        ),
        ({**PMI, "PMI_RANK": "3"}, "PMI_RANK=3 must be below PMI_SIZE=3"),
        # local rank >= local world size, local world > world, node rank >= nodes
        ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 must be below LOCAL_WORLD_SIZE=2"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE=8 is more than WORLD_SIZE=4"),
        ({**TORCHRUN, "GROUP_RANK": "2"}, "GROUP_RANK=2 must be below the number of nodes (2)"),
        (
            {**SLURM_STEP, "SLURM_LOCALID": "2"},
            "SLURM_LOCALID=2 must be below the local world size (2)",
        ),
        (
            {**SLURM_STEP, "SLURM_NODEID": "2"},
            "SLURM_NODEID=2 must be below SLURM_STEP_NUM_NODES=2",
        ),
        (
            {**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "4"},
            "OMPI_COMM_WORLD_LOCAL_RANK=4 must be below OMPI_COMM_WORLD_LOCAL_SIZE=4",
        ),
        ({**PMI, "MPI_LOCALRANKID": "1"}, "MPI_LOCALRANKID=1 must be below MPI_LOCALNRANKS=1"),
        (
            {**PADDLE, "PADDLE_LOCAL_RANK": "2"},
            "PADDLE_LOCAL_RANK=2 must be below the local world size (2)",
        ),
        # non-integers and negatives
        ({**TORCHRUN, "RANK": "one"}, "RANK='one' is not an integer"),
        ({**TORCHRUN, "WORLD_SIZE": "4.0"}, "WORLD_SIZE='4.0' is not an integer"),
        ({**TORCHRUN, "RANK": "-1"}, "RANK=-1 must be at least 0"),
        ({**TORCHRUN, "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
        ({**PADDLE, "PADDLE_TRAINERS_NUM": "four"}, "PADDLE_TRAINERS_NUM='four' is not an integer"),
        ({**DMLC, "DMLC_NUM_WORKER": "two"}, "DMLC_NUM_WORKER='two' is not an integer"),
        ({**SLURM_STEP, "SLURM_LOCALID": "x"}, "SLURM_LOCALID='x' is not an integer"),
        ({**SLURM_STEP, "SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not an integer"),
        ({**OPENMPI, "OMPI_COMM_WORLD_SIZE": ""}, "OMPI_COMM_WORLD_SIZE='' is not an integer"),
        ({**PMI, "MPI_LOCALNRANKS": "1x"}, "MPI_LOCALNRANKS='1x' is not an integer"),
        # missing variables
        ({"WORLD_SIZE": "2"}, "RANK is not set, but WORLD_SIZE is"),
        ({"SLURM_PROCID": "0"}, "SLURM_STEP_NUM_TASKS or SLURM_NTASKS or SLURM_NPROCS is not set"),
        ({**DMLC, "DMLC_NUM_SERVER": None}, "DMLC_NUM_SERVER is not set, but DMLC_ROLE is"),
        ({**DMLC, "DMLC_PS_ROOT_URI": None}, "DMLC_PS_ROOT_URI or DMLC_PS_ROOT_PORT is not"),
        (
            {**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": None},
            "SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE are not set",
        ),
        # missing master with world > 1
        (
            {**TORCHRUN, "MASTER_ADDR": None},
            "WORLD_SIZE=4 but MASTER_ADDR or MASTER_PORT is not set",
        ),
        ({**TORCHRUN, "MASTER_ADDR": ""}, "WORLD_SIZE=4 but MASTER_ADDR or MASTER_PORT is not set"),
        (
            {**OPENMPI, "MASTER_PORT": None},
            "OMPI_COMM_WORLD_SIZE=8 but MASTER_ADDR or MASTER_PORT is not set",
        ),
        (
            {**PMI, "MASTER_ADDR": None},
            "PMI_SIZE=3 but MASTER_ADDR or MASTER_PORT is not set",
        ),
        (
            {**SLURM_STEP, "SLURM_JOB_ID": None},
            "neither MASTER_ADDR/MASTER_PORT nor SLURM_STEP_NODELIST/SLURM_JOB_ID",
        ),
        (
            {**PADDLE, "PADDLE_TRAINER_ENDPOINTS": None},
            "PADDLE_TRAINERS_NUM=4 but PADDLE_TRAINER_ENDPOINTS is not set",
        ),
        # bad ports
        ({**TORCHRUN, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
        ({**TORCHRUN, "MASTER_PORT": "0"}, "MASTER_PORT='0' is not a TCP port"),
        ({**TORCHRUN, "MASTER_PORT": "http"}, "MASTER_PORT='http' is not a TCP port"),
        ({**SLURM_STEP, "MASTER_PORT": "-5"}, "MASTER_PORT='-5' is not a TCP port"),
        ({**DMLC, "DMLC_PS_ROOT_PORT": "x"}, "DMLC_PS_ROOT_PORT='x' is not a TCP port"),
        (
            {**PADDLE, "PADDLE_TRAINER_ENDPOINTS": "a:1,a:2,b:1,b:99999"},
            "the port in PADDLE_TRAINER_ENDPOINTS='99999'",
        ),
        # bad hostlists and tasks-per-node
        (
            {**SLURM_STEP, "SLURM_STEP_NODELIST": "node[07-08"},
            "SLURM_STEP_NODELIST='node[07-08' is not a SLURM host list",
        ),
        (
            {**SLURM_STEP, "SLURM_STEP_NODELIST": "node[08-07]"},
            "SLURM_STEP_NODELIST='node[08-07]' is not a SLURM host list",
        ),
        (
            {**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x)"},
            "SLURM_STEP_TASKS_PER_NODE='2(x)' is not SLURM's tasks-per-node form",
        ),
        (
            {**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "3,2"},
            "SLURM_STEP_TASKS_PER_NODE='3,2' gives 5 tasks on 2 nodes",
        ),
        (
            {**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x3)"},
            "SLURM_STEP_TASKS_PER_NODE='2(x3)' gives 6 tasks on 3 nodes, but "
            "SLURM_STEP_NUM_TASKS=4",
        ),
        # paddle and dmlc specifics
        (
            {**PADDLE, "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1"},
            "PADDLE_TRAINER_ENDPOINTS lists 2 endpoints but PADDLE_TRAINERS_NUM=4",
        ),
        (
            {**PADDLE, "PADDLE_TRAINER_ENDPOINTS": "a:1,a:2,b:1,b"},
            "PADDLE_TRAINER_ENDPOINTS has 'b', which is not host:port",
        ),
        (
            {**PADDLE, "PADDLE_CURRENT_ENDPOINT": "10.0.0.1:6170"},
            "PADDLE_CURRENT_ENDPOINT='10.0.0.1:6170' is not entry 3 of PADDLE_TRAINER_",
        ),
        (
            {**DMLC, "DMLC_ROLE": "master"},
            "DMLC_ROLE='master' must be one of: worker, server, scheduler",
        ),
    ],
)
def test_errors_name_the_variable_and_its_value(env: dict[str, str | None], message: str) -> None:
    clean = {k: v for k, v in env.items() if v is not None}  # None: variable removed
    with pytest.raises(ClusterError) as caught:
        resolve(clean)
    assert message in str(caught.value)


@pytest.mark.parametrize("hostlist", ["", "a,,b", "node[]", "node[a-b]", "node]1[", "n[1-2]]"])
def test_bad_hostlist(hostlist: str) -> None:
    with pytest.raises(ClusterError, match=r"SLURM_JOB_NODELIST=.* is not a SLURM host list"):
        expand_hostlist(hostlist, "SLURM_JOB_NODELIST")


def test_core_imports_no_framework() -> None:
    code = (
        "import sys, polytrain.distributed.cluster\n"
        "print(sorted(m for m in ('torch', 'paddle', 'mxnet') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
