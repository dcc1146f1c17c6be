"""Dropout masks that are the same on every backend (``dropout_masks="parity"``).

By default (``"framework"``) each backend's dropout draws its mask from its own
framework's generator: fast, and different on every framework. With ``"parity"`` the
masks come from numpy instead, from a counter-based key: the k-th dropout call of
training step s under seed ``seed`` in process ``rank`` draws
``np.random.default_rng([seed, s, rank, k])``
(numpy's SeedSequence mixes the key, so masks of nearby keys are independent). Every
backend runs the spec's layers in the same order, and the step runner calls replicas
and micro-batches in the same order, so call k is the same layer, on the same samples,
everywhere. Each backend then multiplies its input by the mask (values 0 or 1/(1-p),
cast to the model's dtype): one multiply, exact in any precision.

While a :meth:`ParityMasks.step` block is open, :func:`parity_mask` answers every
backend's dropout layer in training; outside it (or in the framework mode) it answers
None and the layer uses its framework's own dropout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from polytrain.errors import ConfigError

DROPOUT_MASKS = ("framework", "parity")
_LOCK = threading.Lock()
_active: ParityMasks | None = None


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`DROPOUT_MASKS`, else one line saying the choices."""
    if mode not in DROPOUT_MASKS:
        raise ConfigError(
            f"--dropout-masks must be one of {', '.join(DROPOUT_MASKS)}, got {mode!r}."
        )
    return mode


class ParityMasks:
    """The numpy mask source of one run's process: key (seed, step, rank, call index)."""

    def __init__(self, seed: int, rank: int = 0) -> None:
        self.seed, self.rank = int(seed), int(rank)
        self._step = 0
        self._calls = 0

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Answer :func:`parity_mask` for training step ``step`` (0-based) in this block."""
        global _active
        with _LOCK:
            if _active is not None:
                raise ConfigError("Parity dropout masks: a step is already open.")
            self._step, self._calls, _active = int(step), 0, self
        try:
            yield
        finally:
            with _LOCK:
                _active = None

    def next_mask(self, shape: tuple[int, ...], p: float) -> np.ndarray:
        """The next call's float64 mask of ``shape``: 0 with probability ``p``, else
        1/(1-p)."""
        with _LOCK:
            key = [self.seed, self._step, self.rank, self._calls]
            self._calls += 1
        if p >= 1.0:
            return np.zeros(shape)
        keep = np.random.default_rng(key).random(shape) >= p
        return keep / (1.0 - p)


def parity_active() -> bool:
    """Whether a parity step is open (dropout layers must take :func:`parity_mask`)."""
    return _active is not None


def parity_mask(shape: tuple[int, ...], p: float, dtype: str | np.dtype) -> np.ndarray | None:
    """The mask a training dropout layer of rate ``p`` multiplies its input of ``shape``
    by, in ``dtype``, when a parity step is open; None otherwise (use the framework's)."""
    source = _active
    if source is None:
        return None
    return source.next_mask(tuple(int(n) for n in shape), p).astype(dtype)
