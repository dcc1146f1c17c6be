"""Reductions across devices (host replicas or GPUs) and processes (paddle.distributed)."""

from __future__ import annotations

from collections.abc import Sequence

import paddle

from ._devices import moved


def allreduce(tensors: Sequence[paddle.Tensor], op: str, world_size: int) -> None:
    """Every tensor becomes the sum (or mean) over the tensors and the processes."""
    with paddle.no_grad():
        total = tensors[0].clone()
        for t in tensors[1:]:
            total.add_(moved(t, total.place))
        count = len(tensors)
        if world_size > 1:
            import paddle.distributed as dist

            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            count *= world_size
        if op == "mean":
            total.scale_(1.0 / count)
        for t in tensors:
            paddle.assign(moved(total, t.place), output=t)


def broadcast(tensors: Sequence[paddle.Tensor], src: int, world_size: int) -> None:
    """``tensors[src]`` into the others (and rank 0's into every process first)."""
    with paddle.no_grad():
        source = tensors[src]
        if world_size > 1:
            import paddle.distributed as dist

            dist.broadcast(source, src=0)
        for i, t in enumerate(tensors):
            if i != src:
                paddle.assign(moved(source, t.place), output=t)
