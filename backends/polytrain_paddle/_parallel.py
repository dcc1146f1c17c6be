"""Reductions across devices (host replicas or GPUs) and processes (paddle.distributed);
gradients in flat buckets (:func:`sync_buckets`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import paddle

from polytrain.backend import autodiff
from polytrain.backend.buckets import plan_buckets

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


def gradients_to_sum(
    replicas: Sequence[Sequence[paddle.Tensor]], world_size: int
) -> list[list[paddle.Tensor]]:
    """:func:`polytrain.backend.autodiff.gradients_to_sum` for Paddle parameters."""
    return autodiff.gradients_to_sum(replicas, world_size, lambda p: p.grad, _zero_grad)


def _zero_grad(p: paddle.Tensor) -> paddle.Tensor:
    p._set_grad_ivar(paddle.zeros_like(p))
    grad = p.grad
    assert grad is not None  # just set
    return grad


def sync_buckets(grads: Sequence[Sequence[paddle.Tensor]], world_size: int, limit: int) -> None:
    """Sum every gradient over the replicas (one list of gradients each) and processes,
    ``limit`` bytes per fused bucket: one concatenation per bucket and replica, one
    ``all_reduce`` per bucket, then each gradient assigned its slice."""
    if not grads or not grads[0]:
        return
    with paddle.no_grad():
        first = grads[0]
        counts = [math.prod(g.shape) for g in first]
        sizes = [n * g.element_size() for n, g in zip(counts, first, strict=True)]
        keys = [(str(g.dtype), str(g.place)) for g in first]
        for bucket in plan_buckets(sizes, keys, limit):
            members = [[per_replica[i] for i in bucket] for per_replica in grads]
            total = paddle.concat([g.reshape([-1]) for g in members[0]])
            for m in members[1:]:
                total.add_(moved(paddle.concat([g.reshape([-1]) for g in m]), total.place))
            if world_size > 1:
                import paddle.distributed as dist

                dist.all_reduce(total, op=dist.ReduceOp.SUM)
            for m in members:
                flat = moved(total, m[0].place)
                pieces = paddle.split(flat, [counts[i] for i in bucket]) if len(m) > 1 else [flat]
                for g, piece in zip(m, pieces, strict=True):
                    paddle.assign(piece.reshape(g.shape), output=g)
