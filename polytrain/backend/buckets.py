"""Gradient buckets: which gradients travel together in one collective.

One collective per parameter is latency-bound (LeNet has 8 parameters, ResNet-18 76);
PyTorch's DDP packs gradients into flat buckets of about 25 MB and reduces each with one
collective. :func:`plan_buckets` decides the packing for any backend that syncs this way
(the torch and Paddle backends); it looks only at sizes and at a key (dtype, device) that
every gradient of a bucket must share, since a flat buffer has one of each.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence

from polytrain.errors import ConfigError

DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb
BUCKET_ENV = "POLYTRAIN_BUCKET_MB"


def bucket_bytes(mb: float | None = None, env: Mapping[str, str] | None = None) -> int:
    """Bytes per bucket: ``mb`` (``BackendOptions.bucket_mb``), else $POLYTRAIN_BUCKET_MB,
    else 25 MB. 0 means one collective per parameter (the unbucketed path)."""
    source = "bucket_mb"
    if mb is None:
        text = (os.environ if env is None else env).get(BUCKET_ENV, "").strip()
        source = BUCKET_ENV
        try:
            mb = float(text) if text else DEFAULT_BUCKET_MB
        except ValueError:
            raise ConfigError(f"{BUCKET_ENV}={text!r} is not a number of megabytes.") from None
    if not mb >= 0:  # also refuses nan
        raise ConfigError(f"{source}={mb} must be >= 0 (0: one collective per parameter).")
    return int(mb * 2**20)


def plan_buckets(sizes: Sequence[int], keys: Sequence[Hashable], limit: int) -> list[list[int]]:
    """Indices of gradients grouped into buckets, in order: consecutive gradients of one
    key, at most ``limit`` bytes together (a larger gradient gets a bucket of its own).
    ``limit`` 0: every gradient alone."""
    buckets: list[list[int]] = []
    filled = 0
    for i, (size, key) in enumerate(zip(sizes, keys, strict=True)):
        current = buckets[-1] if buckets else None
        if current is None or keys[current[0]] != key or filled + size > limit:
            buckets.append([i])
            filled = size
        else:
            current.append(i)
            filled += size
    return buckets
