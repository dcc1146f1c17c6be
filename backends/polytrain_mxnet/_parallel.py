"""MXNet across devices (a ``local``/``device`` kvstore, or plain copies) and across
processes: the parameter-server kvstore ``dist_sync`` (ps-lite, in the wheel).

A scheduler, one or more servers and the workers find each other through the ``DMLC_*``
variables (``polytrain launch --backend mxnet`` sets them). Workers push their gradients;
with ``dist_sync`` and no updater on the servers, each server sums the pushes of every
worker of a round and every worker pulls that sum. The update itself stays with
polytrain's optimizer (:mod:`._optim`), so the rule is the canonical one, never MXNet's.

What this module adds to the bare kvstore:

* **Timeouts.** ps-lite has none: a dead peer leaves the others blocked forever in
  ``kv.create``, a push/pull or the exit barrier. Every blocking call runs under a
  :class:`polytrain.distributed.watchdog.Deadline` that ends the process with a clear message after
  ``timeout`` s.
* **World size.** ``DMLC_NUM_WORKER`` is read by each process from its own environment;
  nodes launched with different ``--nnodes``/``--nproc-per-node`` disagree. A first round
  in which every worker pushes 1 makes the servers count the workers; a different count
  is a :class:`~polytrain.errors.ClusterError`.
* **Keys.** ``kv.init`` is collective (rank 0 pushes, then a barrier), so keys are handed
  out in call order, identically on every worker, and initialised before the first
  backward (a lazily initialised key races with the first push).
* **Exact host sums.** The servers reduce in float32 even for float64 arrays
  (0.1 + 0.1 comes back as 0.20000000298) and abort on integer arrays. Host numbers
  (:meth:`DistSync.sum_numbers`) are therefore gathered, not summed, on the servers: each
  worker writes its values, split into three float32 parts, into its own slot of a
  zero vector, so every server-side addition is ``x + 0`` and exact; the sum is then
  taken in float64 in rank order, identically on every worker.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import sys
from collections.abc import Sequence
from typing import Any

import mxnet as mx
import numpy as np

from polytrain.distributed.watchdog import Deadline
from polytrain.errors import ClusterError

from ._launcher import RANK_FILE_VAR

EXIT_BARRIER_SECONDS = 10.0
SAME_SIZE = "was every node started with the same --nnodes and --nproc-per-node?"


def _split3(values: np.ndarray) -> np.ndarray:
    """float64 -> three float32 parts whose float64 sum is the value again (exactly)."""
    hi: np.ndarray = values.astype(np.float32)
    rest: np.ndarray = values - hi.astype(np.float64)
    mid: np.ndarray = rest.astype(np.float32)
    lo: np.ndarray = (rest - mid.astype(np.float64)).astype(np.float32)
    return np.stack([hi, mid, lo])


class DistSync:
    """One worker's connection to the parameter servers (created by ``init_distributed``)."""

    def __init__(self, timeout: float) -> None:
        self.deadline = Deadline(timeout, "mxnet dist_sync")
        where = f"{os.environ.get('DMLC_PS_ROOT_URI')}:{os.environ.get('DMLC_PS_ROOT_PORT')}"
        workers = os.environ.get("DMLC_NUM_WORKER")
        with self.deadline(
            f"joining the parameter server at {where} ({workers} workers; is the scheduler "
            f"reachable, and {SAME_SIZE})"
        ):
            self.kv: Any = mx.kv.create("dist_sync")
        self.rank = int(self.kv.rank)
        self.world_size = int(self.kv.num_workers)
        self._next_key = 0
        self._scratch: dict[tuple[tuple[int, ...], str], int] = {}
        rank_file = os.environ.get(RANK_FILE_VAR)
        if rank_file:  # ps-lite, not the launcher, numbers the workers: tell the launcher
            with open(rank_file, "w", encoding="ascii") as fh:
                fh.write(str(self.rank))
        atexit.register(self._close_at_exit)
        counted = self._count_workers()
        if counted != self.world_size:
            self.close(barrier=False)
            raise ClusterError(
                f"The parameter servers counted {counted} workers, but this worker was started "
                f"for {self.world_size} (DMLC_NUM_WORKER): the nodes disagree on the world "
                "size. Give every node the same --nnodes and --nproc-per-node."
            )

    # -- keys -------------------------------------------------------------------------------

    def new_keys(
        self,
        shapes: Sequence[tuple[int, ...]],
        dtype: str = "float32",
        what: str = "initialising kvstore keys (a barrier of all workers)",
    ) -> list[int]:
        """Fresh keys, initialised now (collective: every worker makes the same calls)."""
        keys = list(range(self._next_key, self._next_key + len(shapes)))
        self._next_key += len(shapes)
        if keys:
            with self.deadline(what):
                self.kv.init(keys, [mx.nd.zeros(s, dtype=dtype) for s in shapes])
        return keys

    def _scratch_key(self, shape: tuple[int, ...], dtype: str) -> int:
        """A reusable key for ad-hoc reductions of one shape (a round per call)."""
        if (shape, dtype) not in self._scratch:
            self._scratch[(shape, dtype)] = self.new_keys([shape], dtype)[0]
        return self._scratch[(shape, dtype)]

    def _count_workers(self) -> int:
        what = f"counting the workers (a first barrier and push of every worker; {SAME_SIZE})"
        key = self.new_keys([(1,)], what=what)[0]
        one = mx.nd.ones((1,))
        with self.deadline(what):
            self.kv.pushpull(key, one, out=one)
            return round(float(one.asnumpy()[0]))

    # -- reductions -------------------------------------------------------------------------

    def sum_gradients(self, keys: Sequence[int], grads: Sequence[Sequence[Any]]) -> None:
        """Per key, sum the local copies and every worker's push; write it to every copy."""
        if grads and grads[0][0].dtype != np.float32:  # fp64: the servers add in float32
            for copies in grads:
                self.allreduce(copies, "sum")
            return
        with self.deadline("summing gradients over the workers"):
            for i, (key, copies) in enumerate(zip(keys, grads, strict=True)):
                self.kv.pushpull(key, list(copies), out=list(copies), priority=-i)
            for copies in grads:
                for g in copies:
                    g.wait_to_read()

    def allreduce(self, tensors: Sequence[Any], op: str) -> None:
        """Every tensor becomes the sum (or mean) over tensors and workers, in place."""
        first = tensors[0]
        if first.dtype != np.float32:  # the servers add in float32: gather exactly instead
            total = sum(t.asnumpy().astype(np.float64) for t in tensors)
            result = self.sum_numbers(np.asarray(total).reshape(-1)).reshape(first.shape)
            if op == "mean":
                result = result / (len(tensors) * self.world_size)
            for t in tensors:
                t[:] = mx.nd.array(result, ctx=t.context, dtype=t.dtype)
            return
        key = self._scratch_key(tuple(first.shape), "float32")
        with self.deadline("an allreduce over the workers"):
            self.kv.pushpull(key, list(tensors), out=list(tensors))
            for t in tensors:
                t.wait_to_read()
        if op == "mean":
            for t in tensors:
                t /= len(tensors) * self.world_size

    def broadcast(self, tensor: Any, outs: Sequence[Any]) -> None:
        """Rank 0's ``tensor`` into every tensor of ``outs`` on every worker: rank 0 pushes
        it, the others push zeros, so the servers' sum is rank 0's value exactly."""
        if tensor.dtype != np.float32:
            flat = tensor.asnumpy().astype(np.float64).reshape(-1)
            mine = flat if self.rank == 0 else np.zeros_like(flat)
            result = self.sum_numbers(mine).reshape(tensor.shape)
            for t in outs:
                t[:] = mx.nd.array(result, ctx=t.context, dtype=t.dtype)
            return
        key = self._scratch_key(tuple(tensor.shape), "float32")
        value = tensor if self.rank == 0 else mx.nd.zeros_like(tensor)
        with self.deadline("a broadcast from rank 0"):
            self.kv.push(key, value)
            self.kv.pull(key, out=list(outs))
            for t in outs:
                t.wait_to_read()

    def sum_numbers(self, values: np.ndarray) -> np.ndarray:
        """float64 values summed over the workers exactly (see the module docstring)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        slots = np.zeros((self.world_size, 3, values.size), dtype=np.float32)
        slots[self.rank] = _split3(values)
        gathered = mx.nd.array(slots, dtype="float32")
        key = self._scratch_key(slots.shape, "float32")
        with self.deadline("summing host numbers over the workers"):
            self.kv.pushpull(key, gathered, out=gathered)
            parts = gathered.asnumpy().astype(np.float64)
        per_rank = parts[:, 0] + parts[:, 1] + parts[:, 2]
        total = per_rank[0].copy()
        for row in per_rank[1:]:  # rank order, the same on every worker
            total += row
        return total

    # -- exit -------------------------------------------------------------------------------

    def close(self, barrier: bool = True, deadline: Deadline | None = None) -> None:
        """Leave the job. Normally all workers meet at a barrier first (MXNet's default);
        a failing worker skips it, so it does not wait for peers that still train."""
        kv, self.kv = self.kv, None
        if kv is None:
            return
        deadline = deadline or self.deadline
        with deadline("leaving the parameter server (the exit barrier of all workers)"):
            if not barrier:
                mx.base.check_call(
                    mx.base._LIB.MXKVStoreSetBarrierBeforeExit(kv.handle, ctypes.c_int(0))
                )
            del kv  # the kvstore's destructor runs the barrier and ps::Finalize
            gc.collect()

    def _close_at_exit(self) -> None:
        """A worker that exits without ``shutdown_distributed`` (a script that forgot it, or
        a failure before training started) still meets the others at the exit barrier, but
        waits there at most :data:`EXIT_BARRIER_SECONDS`: its peers may be training on."""
        if self.kv is not None:
            failed = hasattr(sys, "last_value")  # an uncaught exception was printed
            short = Deadline(min(self.deadline.timeout, EXIT_BARRIER_SECONDS), "mxnet dist_sync")
            self.close(barrier=not failed, deadline=short)


# -- the backend's collectives --------------------------------------------------------------


def allreduce(tensors: Sequence[Any], op: str, dist: DistSync | None) -> None:
    """Every tensor becomes the sum (or mean) over the tensors and, under ``dist``, the
    workers."""
    if dist is not None and dist.world_size > 1:
        dist.allreduce(tensors, op)  # sums the local tensors too
        return
    ctx = tensors[0].context
    total = mx.nd.add_n(*(t.as_in_context(ctx) for t in tensors))
    if op == "mean":
        total = total / len(tensors)
    for t in tensors:
        total.copyto(t)


def broadcast(tensors: Sequence[Any], src: int, dist: DistSync | None) -> None:
    """``tensors[src]`` into the others (then rank 0's into every worker under ``dist``)."""
    for i, t in enumerate(tensors):
        if i != src:
            tensors[src].copyto(t)
    if dist is not None and dist.world_size > 1:
        dist.broadcast(tensors[src], tensors)


def local_kvstore(devices: Sequence[Any], shapes: Sequence[tuple[int, ...]], dtype: str) -> Any:
    """The kvstore that sums gradients over the devices of one process, its keys
    initialised now: before any backward (a Trainer races otherwise)."""
    on_gpu = any(d.device_type == "gpu" for d in devices)
    kv = mx.kv.create("device" if on_gpu else "local")
    for i, shape in enumerate(shapes):
        kv.init(i, mx.nd.zeros(shape, dtype=dtype))
    return kv
