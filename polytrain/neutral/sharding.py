"""How a batch is cut into shards: one rule for devices, processes and micro-batches.

Shard sizes differ by at most one, larger shards first, nothing is dropped
(10 over 3 is 4, 3, 3). Used by ``split_and_load`` on every backend, by the
loader for per-rank slices, and by gradient accumulation.
"""

from __future__ import annotations

from polytrain.errors import ConfigError


def shard_sizes(n: int, parts: int, *, what: str = "devices") -> list[int]:
    """Sizes of ``parts`` contiguous shards of ``n`` samples, larger first."""
    if parts < 1:
        raise ConfigError(f"Cannot split a batch into {parts} parts: need at least 1.")
    if n < parts:
        raise ConfigError(
            f"Cannot split a batch of {n} samples over {parts} {what}: every shard needs at "
            f"least one sample. Use a batch size of at least {parts}, or fewer {what}."
        )
    base, extra = divmod(n, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def shard_bounds(n: int, parts: int, *, what: str = "devices") -> list[tuple[int, int]]:
    """``(start, stop)`` of each shard of :func:`shard_sizes`."""
    bounds = []
    start = 0
    for size in shard_sizes(n, parts, what=what):
        bounds.append((start, start + size))
        start += size
    return bounds


def share_bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, stop)`` of share ``index`` of ``n`` items over ``parts`` holders by the same
    rule, where a share may be empty (evaluation: 3 test samples over 4 processes)."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)
