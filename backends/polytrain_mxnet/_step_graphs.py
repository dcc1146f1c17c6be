"""The step's cross-entropy and accuracy count as small cached graphs.

Op by op, the float64 cross-entropy is six imperative operators and the accuracy count
four, and on a CPU each one costs 20-40 us of Python dispatch and autograd bookkeeping.
Hybridized, each is one CachedOp call: LeNet at batch 256 with 2 threads goes from 341 to
141 us (the loss, forward and backward) and from 117 to 38 us (the count)
(docs/performance.md, "MXNet's step graphs"). The graphs hold the same operators, so the
floats are the same bit for bit (tests/backends/test_mxnet_step_graphs.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mxnet import autograd, gluon

#: logits dtypes the graphs take; float16/bfloat16 logits (mixed precision) run op by op
GRAPH_DTYPES = ("float32", "float64")


def fits_graph(logits: Any, labels: Any) -> bool:
    """Whether the graphs take these arrays: float32/float64 logits on the labels' context
    (a hybridized block takes one context; a pipeline's last stage may hold the logits on
    another CPU context than the labels, which the operators run one by one accept)."""
    return bool(np.dtype(logits.dtype).name in GRAPH_DTYPES and logits.context == labels.context)


class _CrossEntropy(gluon.HybridBlock):
    """Sum or mean over samples of ``-log_softmax(logits in float64)[label]``, cast to
    ``out_dtype``: the ``cross_entropy`` verb without ``ignore_index``."""

    def __init__(self, mean: bool, out_dtype: str) -> None:
        super().__init__()
        self._mean = mean
        self._out_dtype = out_dtype

    def hybrid_forward(self, F: Any, logits: Any, labels: Any) -> Any:
        logp = F.log_softmax(F.cast(logits, "float64"), axis=1)
        losses = -F.pick(logp, F.reshape(labels, (-1,)), axis=1)
        total = F.mean(losses) if self._mean else F.sum(losses)
        return F.cast(total, self._out_dtype)


class _CorrectCount(gluon.HybridBlock):
    """How many rows' argmax equals the label, in the logits' dtype (argmax's)."""

    def __init__(self, dtype: str) -> None:
        super().__init__()
        self._dtype = dtype

    def hybrid_forward(self, F: Any, logits: Any, labels: Any) -> Any:
        predicted = F.argmax(logits, axis=1)
        return F.sum(predicted == F.cast(F.reshape(labels, (-1,)), self._dtype))


class StepGraphs:
    """One hybridized block per (graph, reduction, dtype), made at its first use.

    ``static_alloc`` keeps each graph's memory between calls. ``static_shape`` is not
    set: batch sizes change (an epoch's last batch, evaluation batches), and for graphs this
    small it measured slower (153 against 141 us for the loss). Outputs are fresh arrays
    on every call, so held counts and losses stay as they were computed."""

    def __init__(self) -> None:
        self._blocks: dict[tuple[str, ...], gluon.HybridBlock] = {}

    def _block(self, key: tuple[str, ...], make: Any) -> gluon.HybridBlock:
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = make()
            block.hybridize(static_alloc=True)
        return block

    def cross_entropy(self, logits: Any, labels: Any, mean: bool, out_dtype: str) -> Any:
        key = ("ce", str(mean), out_dtype)
        return self._block(key, lambda: _CrossEntropy(mean, out_dtype))(logits, labels)

    def count_correct(self, logits: Any, labels: Any) -> Any:
        dtype = np.dtype(logits.dtype).name
        block = self._block(("count", dtype), lambda: _CorrectCount(dtype))
        with autograd.pause():  # a metric: nothing to differentiate, nothing to record
            return block(logits, labels)
