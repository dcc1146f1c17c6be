"""Several jax processes: ``jax.distributed`` joined with Gloo's CPU collectives, and the
two reductions polytrain needs across them.

XLA's Gloo collectives fail to form a context when a process holds several host devices
(``--xla_force_host_platform_device_count``, polytrain's ``cpu:N``) and a computation
spans all of them, so the cross-process programs run on a mesh of one device per
process: each process's first device, where its replicas were already reduced.
``jax.distributed.initialize`` must come before jax runs anything in the process, so the
backend joins when it is made, in a process whose variables say it was launched as part
of a job (:func:`join_if_launched`); ``init_distributed`` then finds it joined.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from polytrain.distributed.cluster import ClusterInfo
from polytrain.errors import BackendError, ClusterError

_joined: tuple[int, int] | None = None  # (rank, world size) once jax.distributed is joined


def join(info: ClusterInfo, timeout: float) -> None:
    """Join ``info``'s job (once per process); one line when it cannot be joined."""
    global _joined
    if not info.is_distributed or _joined == (info.rank, info.world_size):
        return
    if info.num_servers or _joined is not None:
        what = "a parameter-server job" if info.num_servers else "a second job"
        raise BackendError(f"The jax backend cannot join {what}: jax.distributed runs one "
                           "data-parallel job per process.")  # fmt: skip
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    address = f"{info.master_addr}:{info.master_port}"
    try:
        jax.distributed.initialize(
            coordinator_address=address, num_processes=info.world_size,
            process_id=info.rank, initialization_timeout=max(1, int(timeout)),
        )  # fmt: skip
    except RuntimeError as exc:
        raise ClusterError(
            f"jax.distributed could not join rank {info.rank} of {info.world_size} at "
            f"{address} within {timeout:.0f} s: {exc}. Check that rank 0 runs, the port is "
            "free there, and that jax computed nothing in this process before it joined."
        ) from exc
    _joined = (info.rank, info.world_size)
    if jax.process_count() != info.world_size:
        leave()
        raise ClusterError(
            f"Mismatched world sizes: this process was started as rank {info.rank} of "
            f"{info.world_size}, but jax.distributed formed a job of {jax.process_count()}. "
            "Give every node the same --nnodes and --nproc-per-node."
        )


def join_if_launched(timeout: float) -> None:
    """Join the job this process's launcher variables describe, if any (within
    ``polytrain launch --timeout`` when it launched us, else ``timeout``)."""
    from polytrain.distributed.cluster import resolve
    from polytrain.plugins.registry import cluster_environments

    from ._launcher import JOIN_TIMEOUT_VAR

    given = os.environ.get(JOIN_TIMEOUT_VAR, "")
    join(resolve(environments=cluster_environments()), float(given) if given else timeout)


def leave() -> None:
    """Leave the job; a coordinator already gone is no error (jax's own exit hook would
    otherwise print a traceback over the line that says why the run ended)."""
    global _joined
    if _joined is None:
        return
    _joined = None
    _programs.cache_clear()
    try:
        jax.distributed.shutdown()
    except Exception:  # XlaRuntimeError: the peers or the coordinator left first
        state = jax._src.distributed.global_state  # private: shutdown() keeps a failed client
        state.client = state.service = None


def summed(array: Any) -> Any:
    """The sum of ``array`` over every process, on ``array``'s device."""
    return _run("sum", array)


def summed_together(arrays: Sequence[Any]) -> list[Any]:
    """:func:`summed` of each array, as one collective over their concatenation (one
    dtype; each result on its array's device)."""
    if len({a.dtype for a in arrays}) > 1:
        return [summed(a) for a in arrays]
    flat = summed(jnp.concatenate([a.ravel() for a in arrays]))
    ends = np.cumsum([a.size for a in arrays])[:-1]
    return [
        jax.device_put(part.reshape(a.shape), a.devices().pop())
        for part, a in zip(jnp.split(flat, ends), arrays, strict=True)
    ]


def from_rank0(array: Any) -> Any:
    """Process 0's ``array``, on ``array``'s device in every process."""
    return _run("first", array)


def _run(kind: str, array: Any) -> Any:
    mesh, mine, programs = _programs()
    (home,) = array.devices()
    local = jax.device_put(array, mine)[None]
    shape = (mesh.devices.size, *array.shape)
    spread = jax.make_array_from_single_device_arrays(
        shape, NamedSharding(mesh, PartitionSpec("p")), [local]
    )
    return jax.device_put(programs[kind](spread).addressable_data(0), home)


@cache
def _programs() -> tuple[Mesh, Any, dict[str, Any]]:
    firsts: dict[int, Any] = {}
    for device in jax.devices():
        firsts.setdefault(device.process_index, device)
    mesh = Mesh(np.array([firsts[i] for i in sorted(firsts)]), ("p",))
    everywhere = NamedSharding(mesh, PartitionSpec())
    programs = {
        "sum": jax.jit(lambda a: a.sum(0), out_shardings=everywhere),
        "first": jax.jit(lambda a: a[0], out_shardings=everywhere),
    }
    return mesh, firsts[jax.process_index()], programs
