"""Reductions across devices (torch.cuda.comm, or host memory for ``cpu:K``) and processes
(torch.distributed); gradients in flat buckets (:func:`sync_buckets`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from polytrain.backend import autodiff
from polytrain.backend.buckets import plan_buckets

from ._devices import on_distinct_gpus


def allreduce(tensors: Sequence[torch.Tensor], op: str, world_size: int) -> None:
    """Every tensor becomes the sum (or mean) over the tensors and the processes."""
    with torch.no_grad():
        gpus = on_distinct_gpus(tensors)
        if gpus:  # untested here (no GPU): torch.cuda.comm, NCCL when available
            from torch.cuda import comm

            total = comm.reduce_add(list(tensors), tensors[0].device.index)
        else:  # emulated cpu:K devices: an ordinary reduction in host memory
            total = tensors[0].clone()
            for t in tensors[1:]:
                total.add_(t.to(total.device))
        count = len(tensors)
        if world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            count *= world_size
        if op == "mean":
            total.div_(count)
        if gpus and len(tensors) > 1:
            tensors[0].copy_(total)
            comm.broadcast(tensors[0], out=list(tensors[1:]))
            return
        for t in tensors:
            t.copy_(total)


def broadcast(tensors: Sequence[torch.Tensor], src: int, world_size: int) -> None:
    """``tensors[src]`` into the others (and rank 0's into every process first)."""
    with torch.no_grad():
        source = tensors[src]
        if world_size > 1:
            import torch.distributed as dist

            dist.broadcast(source, src=0)
        for i, t in enumerate(tensors):
            if i != src:
                t.copy_(source)


def sync_buckets(
    replicas: Sequence[Sequence[torch.nn.Parameter]], world_size: int, limit: int
) -> None:
    """Sum every gradient over the replicas (one list of parameters each) and processes,
    ``limit`` bytes per flat bucket: one concatenation per bucket and replica, one
    collective per bucket (issued asynchronously, so packing the next bucket overlaps
    the reduction of this one), one multi-tensor copy back. Missing gradients as in
    :func:`gradients_to_sum`."""
    with torch.no_grad():
        grads = [list(g) for g in zip(*gradients_to_sum(replicas, world_size), strict=True)]
        if not grads:
            return
        first = grads[0]
        sizes = [g.numel() * g.element_size() for g in first]
        keys = [(g.dtype, g.device) for g in first]
        pending: list[tuple[Any, torch.Tensor, list[list[torch.Tensor]]]] = []
        for bucket in plan_buckets(sizes, keys, limit):
            members = [[per_replica[i] for i in bucket] for per_replica in grads]
            total = _local_sum([_flatten_dense_tensors(m) for m in members])
            work = None
            if world_size > 1:
                import torch.distributed as dist

                work = dist.all_reduce(total, op=dist.ReduceOp.SUM, async_op=True)
            pending.append((work, total, members))
        for work, total, members in pending:
            if work is not None:
                work.wait()
            for m in members:
                flat = total if total.device == m[0].device else total.to(m[0].device)
                torch._foreach_copy_(m, _unflatten_dense_tensors(flat, m))


def gradients_to_sum(
    replicas: Sequence[Sequence[torch.nn.Parameter]], world_size: int
) -> list[list[torch.Tensor]]:
    """:func:`polytrain.backend.autodiff.gradients_to_sum` for torch parameters."""
    return autodiff.gradients_to_sum(replicas, world_size, lambda p: p.grad, _zero_grad)


def _zero_grad(p: torch.nn.Parameter) -> torch.Tensor:
    p.grad = torch.zeros_like(p)
    return p.grad


def _local_sum(flats: list[torch.Tensor]) -> torch.Tensor:
    """The sum of one bucket's flat gradients over the replicas, on the first's device."""
    if len(flats) > 1 and on_distinct_gpus(flats):  # untested here (no GPU)
        from torch.cuda import comm

        return comm.reduce_add(flats, flats[0].device.index)
    total = flats[0]  # a fresh tensor (the concatenation): summed into in place
    for flat in flats[1:]:
        total.add_(flat.to(total.device))
    return total
