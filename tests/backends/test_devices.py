"""Which device each process uses, worked out without a GPU: the GPU count is a parameter.

``--devices gpu`` is this process's GPU, by local rank, when several processes share the
node; every launcher's variables give the local rank (polytrain.distributed.cluster and
the backends' launcher environments). The backends set that GPU current before the
process group exists: the GPU index they pick is checked here on device objects (which
need no GPU), the order in tests/distributed/test_devices_dist.py with real process groups.
"""

from __future__ import annotations

from typing import Any

import pytest

from polytrain.backend.buckets import bucket_bytes, plan_buckets
from polytrain.backend.devices import parse_devices
from polytrain.distributed.cluster import ClusterInfo, resolve
from polytrain.errors import ConfigError
from polytrain.plugins.registry import cluster_environments
from polytrain.testing import backends_under_test

MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def cluster(local_rank: int, local_world_size: int, world_size: int | None = None) -> ClusterInfo:
    world = world_size or local_world_size
    return ClusterInfo(local_rank, local_rank, world, local_world_size, 0, 1, "h", 1, "test")


def test_gpu_alone_on_a_node_means_every_gpu() -> None:
    assert parse_devices("gpu", 2) == ["gpu:0", "gpu:1"]
    assert parse_devices("gpu", 2, cluster=cluster(0, 1)) == ["gpu:0", "gpu:1"]
    # one process per node in a two-node job still owns its node's GPUs
    assert parse_devices("gpu", 2, cluster=cluster(0, 1, world_size=2)) == ["gpu:0", "gpu:1"]


@pytest.mark.parametrize("local_rank", [0, 1, 3])
def test_gpu_with_several_processes_on_a_node_is_the_local_ranks(local_rank: int) -> None:
    assert parse_devices("gpu", 4, cluster=cluster(local_rank, 4)) == [f"gpu:{local_rank}"]


def test_explicit_specs_mean_what_they_say_in_every_process() -> None:
    two = cluster(1, 2)
    assert parse_devices("gpu:all", 2, cluster=two) == ["gpu:0", "gpu:1"]
    assert parse_devices("gpu:0,1", 2, cluster=two) == ["gpu:0", "gpu:1"]
    assert parse_devices("gpu:0", 2, cluster=two) == ["gpu:0"]  # processes sharing GPU 0
    assert parse_devices("cpu:2", 0, cluster=two) == ["cpu:0", "cpu:1"]
    assert parse_devices("gpu", 0, cluster=two) == ["cpu"]  # no GPU at all: the CPU, as alone


def test_a_local_rank_without_a_gpu_is_one_line_naming_it() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "3"}
    with pytest.raises(ConfigError) as err:
        parse_devices("gpu", 1, cluster=cluster(1, 2), env=env)
    message = str(err.value)
    assert "\n" not in message
    for part in ("Local rank 1", "1 GPU(s)", "CUDA_VISIBLE_DEVICES '3'", "--devices gpu:0"):
        assert part in message
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES unset"):
        parse_devices("gpu", 2, cluster=cluster(2, 3), env={})


LAUNCHERS: dict[str, dict[str, str]] = {
    "torchrun": {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                 "GROUP_RANK": "1", **MASTER},
    "paddle": {"PADDLE_TRAINER_ID": "3", "PADDLE_TRAINERS_NUM": "4",
               "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:61,10.0.0.1:62,10.0.0.2:61,10.0.0.2:62",
               "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:62"},
    "dmlc": {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9091",
             "DMLC_NUM_WORKER": "4", "DMLC_NUM_SERVER": "1", "POLYTRAIN_RANK": "3",
             "POLYTRAIN_LOCAL_RANK": "1", "POLYTRAIN_LOCAL_WORLD_SIZE": "2"},
    "slurm": {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
              "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
              "SLURM_STEP_TASKS_PER_NODE": "2(x2)", **MASTER},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", **MASTER},
    "pmi": {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
            **MASTER},
}  # fmt: skip


@pytest.mark.parametrize("source", sorted(LAUNCHERS))
def test_every_launchers_variables_give_the_local_ranks_gpu(source: str) -> None:
    environments = cluster_environments()
    if source not in {e.name for e in environments} | {"slurm", "openmpi", "pmi"}:
        pytest.skip(f"the backend whose launcher sets {source}'s variables is not installed")
    info = resolve(LAUNCHERS[source], environments=environments)
    assert (info.source, info.rank, info.local_rank) == (source, 3 + 2 * (source == "torchrun"), 1)
    assert parse_devices("gpu", 4, cluster=info) == ["gpu:1"]
    assert parse_devices("gpu", 8, cluster=info, env={}) == ["gpu:1"]
    with pytest.raises(ConfigError, match="Local rank 1"):
        parse_devices("gpu", 1, cluster=info, env={})


# -- the GPU each backend makes current (device objects need no GPU) -----------------------


def _gpu_index(backend: str, names: list[str]) -> Any:
    if backend == "torch":
        from polytrain_torch import _devices as torch_devices

        return torch_devices.process_gpu_index([torch_devices.native_device(n) for n in names])
    from polytrain_paddle import _devices as paddle_devices

    return paddle_devices.process_gpu_index([paddle_devices.native_device(n) for n in names])


@pytest.mark.parametrize("backend", [b for b in ("torch", "paddle") if b in backends_under_test()])
def test_the_backend_makes_the_processs_first_gpu_current(backend: str) -> None:
    assert _gpu_index(backend, ["cpu"]) is None
    assert _gpu_index(backend, ["cpu:0", "cpu:1"]) is None
    if backend == "paddle" and not _paddle_has_cuda():
        pytest.skip("a CPU build of Paddle cannot make a CUDAPlace (checked: no current GPU)")
    assert _gpu_index(backend, ["gpu:1"]) == 1
    assert _gpu_index(backend, ["gpu:2", "gpu:3"]) == 2
    assert _gpu_index(backend, ["gpu:0"]) == 0


def _paddle_has_cuda() -> bool:
    import paddle

    return bool(paddle.is_compiled_with_cuda())


# -- buckets ---------------------------------------------------------------------------------


def test_buckets_hold_consecutive_gradients_of_one_key_up_to_the_limit() -> None:
    sizes, same = [40, 40, 40, 100, 8, 8], ["f32"] * 6
    assert plan_buckets(sizes, same, 100) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets(sizes, same, 10**9) == [[0, 1, 2, 3, 4, 5]]
    assert plan_buckets(sizes, same, 0) == [[0], [1], [2], [3], [4], [5]]
    assert plan_buckets([4, 4, 4], ["f32", "f64", "f64"], 100) == [[0], [1, 2]]
    assert plan_buckets([500, 4], ["f32", "f32"], 100) == [[0], [1]]  # too big: alone


def test_bucket_size_from_the_option_then_the_environment() -> None:
    assert bucket_bytes(None, {}) == 25 * 2**20  # DDP's default
    assert bucket_bytes(None, {"POLYTRAIN_BUCKET_MB": "1.5"}) == 3 * 2**19
    assert bucket_bytes(0.0, {"POLYTRAIN_BUCKET_MB": "1"}) == 0
    with pytest.raises(ConfigError, match="POLYTRAIN_BUCKET_MB='x'"):
        bucket_bytes(None, {"POLYTRAIN_BUCKET_MB": "x"})
    with pytest.raises(ConfigError, match="must be >= 0"):
        bucket_bytes(-1.0, {})


def test_processes_sharing_a_gpu_sum_through_gloo_not_nccl() -> None:
    """NCCL refuses two ranks on one GPU: more processes on a node than GPUs take gloo."""
    torch = pytest.importorskip("torch")
    from polytrain_torch._backend import collective_engine

    cuda = [torch.device("cuda", 0)]  # a device object needs no GPU
    assert collective_engine(cuda, 2, gpus=2) == "nccl"  # a GPU per process
    assert collective_engine(cuda, 2, gpus=1) == "gloo"  # two processes on one GPU
    assert collective_engine([torch.device("cpu")], 2, gpus=2) == "gloo"
