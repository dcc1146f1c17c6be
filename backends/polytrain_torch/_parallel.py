"""Reductions across devices (torch.cuda.comm, or host memory for ``cpu:K``) and processes
(torch.distributed)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

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
