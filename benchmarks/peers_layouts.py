"""The Keras loop's inputs in Keras' layouts, in numpy (no Keras import: tested in the
project's venv): the canonical initial weights as Keras kernels, and the epoch's samples in
polytrain's loader's batch order (``BatchLoader.order``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .common import Workload, batch_indices, initial_weights

FORMATS = ("channels_first", "channels_last")


def keras_weights(seed: int, data_format: str) -> list[np.ndarray]:
    """The canonical (PyTorch-layout) initial weights in Keras' layouts: conv kernels
    (kh, kw, in, out), dense kernels (in, out); channels_last flattens H,W,C."""
    c1w, c1b, c2w, c2b, f1w, f1b, f2w, f2b = initial_weights(seed)
    if data_format == "channels_last":  # rows of fc1 from C,H,W order to H,W,C order
        f1w = f1w.reshape(128, 50, 4, 4).transpose(0, 2, 3, 1).reshape(128, 800)
    conv = (2, 3, 1, 0)
    return [c1w.transpose(conv), c1b, c2w.transpose(conv), c2b, f1w.T, f1b, f2w.T, f2b]


def ordered(x: np.ndarray, y: np.ndarray, work: Workload, data_format: str) -> tuple[Any, Any]:
    """The epoch's samples in the batches' order (what ``fit(shuffle=False)`` then cuts),
    NHWC for channels_last, int32 labels (jax's default integer)."""
    order = np.concatenate(batch_indices(len(x), work.batch_size, work.seed))
    xs = x[order]
    if data_format == "channels_last":
        xs = np.ascontiguousarray(xs.transpose(0, 2, 3, 1))
    return xs, y[order].astype(np.int32)
