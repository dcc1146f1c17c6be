"""The user's own data: numpy arrays, an ``.npz`` file, or any indexable object with a length.

Each split becomes a :class:`UserArrays` (an :class:`ArrayDataset` the batch loader reads like
any other): inputs ``[N, *input_shape]`` of the model (``[N, H, W]`` is taken as one channel),
float (kept as float32/float64) or uint8 (scaled by 1/255, as the built-in image sets), or
integer ids ``[N, T]`` when the model starts with an Embedding (kept as int64, never scaled);
targets integer class labels ``[N]`` (``[N, T]``: sequence targets) or float values, as the
loss wants
(:func:`polytrain.neutral.losses.check_targets`). Nothing is cut or padded: a mismatch
stops with one line saying what was found.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from polytrain.data.loader import ArrayDataset
from polytrain.data.npz_file import read_npz
from polytrain.errors import DataError
from polytrain.neutral.losses import LossSpec, MetricSpec, check_targets
from polytrain.neutral.models import Embedding, ModelSpec
from polytrain.neutral.shape_check import sample_output_shape

NPZ_KEYS = {"train": ("x_train", "y_train"), "test": ("x_test", "y_test")}


class UserArrays(ArrayDataset):
    """One split of the user's data, already checked against the model and the loss."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        source: str | None = None,
        origin: Mapping[str, str] | None = None,
    ) -> None:
        # no ArrayDataset.__init__: its checks are those of image/label files
        self._raw = x
        self._x = x
        self.y = y
        self.num_classes = int(y.max()) + 1 if y.dtype.kind in "iu" and len(y) else 0
        self.classes = None
        self.source = source
        self.origin: dict[str, str] = dict(origin or {})

    @property
    def image_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        """The shape of one sample's input."""
        return tuple(int(n) for n in self._raw.shape[1:])

    @property
    def x(self) -> np.ndarray:
        return self._raw

    def _take(self, index: slice | np.ndarray, what: str) -> ArrayDataset:
        source = f"{self.source or 'arrays'} [{what}]"
        return UserArrays(
            np.ascontiguousarray(self._raw[index]),
            np.ascontiguousarray(self.y[index]),
            source=source,
            origin=self.origin,
        )


def token_vocabulary(spec: ModelSpec) -> int | None:
    """The vocabulary size when the model's first layer is an Embedding (it takes integer
    ids), else None."""
    first = next(spec.layers(), None)
    return first[1].num_embeddings if first and isinstance(first[1], Embedding) else None


def _stack(items: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """An indexable object of ``(x, y)`` samples -> two arrays (every sample, in order)."""
    try:
        n = len(items)
    except TypeError:
        raise DataError(
            f"{where}: give (x, y) arrays or an indexable object with a length whose "
            f"items are (x, y) pairs; got {type(items).__name__}."
        ) from None
    xs, ys = [], []
    for i in range(n):
        try:
            sample = items[i]
            x, y = sample
        except (IndexError, KeyError) as exc:
            raise DataError(
                f"{where}: item {i} of {n} (its length) cannot be read: {exc!r}."
            ) from None
        except (TypeError, ValueError):
            raise DataError(f"{where}: item {i} is not an (x, y) pair.") from None
        xs.append(np.asarray(x))
        ys.append(np.asarray(y))
    if not xs:
        raise DataError(f"{where}: the dataset is empty (length 0).")
    shapes = {a.shape for a in xs}
    if len(shapes) > 1:
        raise DataError(f"{where}: the samples' inputs differ in shape: {sorted(shapes)[:3]}.")
    return np.stack(xs), np.stack(ys)


def as_split(
    data: Any,
    spec: ModelSpec | None,
    loss: LossSpec,
    metric: MetricSpec,
    where: str,
    origin: Mapping[str, str] | None = None,
) -> UserArrays:
    """``data`` -- an ``(x, y)`` pair of arrays, an :class:`ArrayDataset`, or an indexable
    object of ``(x, y)`` samples -- checked against the model's input and the loss; without
    a spec (a native model: a probe forward checks it) as it is, integers kept as ids."""
    if isinstance(data, ArrayDataset):
        x, y = data.x, data.y
    elif isinstance(data, tuple) and len(data) == 2 and all(hasattr(a, "shape") for a in data):
        x, y = np.asarray(data[0]), np.asarray(data[1])
    else:
        x, y = _stack(data, where)
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} inputs but {len(y)} targets; one target per input.")
    if len(x) == 0:
        raise DataError(f"{where}: the dataset is empty (0 samples).")
    if spec is None:
        return _unchecked(x, y, where, origin)
    want = tuple(spec.input_shape)
    if x.shape[1:] != want and x.shape[1:] == want[1:] and want[:1] == (1,):
        x = x[:, None]  # [N, H, W] as one channel
    if x.shape[1:] != want:
        raise DataError(
            f"{where}: inputs have shape {x.shape}, but model {spec.name!r} takes "
            f"[N, {', '.join(map(str, want))}] (its input_shape)."
        )
    vocab = token_vocabulary(spec)
    if vocab is not None:  # ids of an Embedding: integers, never scaled
        if x.dtype.kind not in "iu":
            raise DataError(
                f"{where}: model {spec.name!r} starts with an Embedding of {vocab} ids: its "
                f"inputs must be integer ids, got {x.dtype}."
            )
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= vocab:
            raise DataError(
                f"{where}: input ids range over {low}..{high}, but the model's Embedding "
                f"takes 0..{vocab - 1}: set its num_embeddings (the vocabulary size)."
            )
        x = x.astype(np.int64)
    elif x.dtype == np.uint8:
        x = x.astype(np.float32) / np.float32(255)
    elif x.dtype.kind != "f":
        raise DataError(f"{where}: inputs must be float or uint8, got {x.dtype}.")
    elif x.dtype != np.float64:
        x = x.astype(np.float32)
    check_targets(loss, metric, y, spec.num_classes, where, sample_output_shape(spec))
    y = y.astype(np.int64) if y.dtype.kind in "iu" else y.astype(np.promote_types(y.dtype, "f4"))
    return UserArrays(np.ascontiguousarray(x), np.ascontiguousarray(y), source=where, origin=origin)


def _unchecked(
    x: np.ndarray, y: np.ndarray, where: str, origin: Mapping[str, str] | None
) -> UserArrays:
    """A split for a native model: uint8 scaled, other floats float32 (float64 kept),
    integers as int64 ids; the model's probe forward checks the shapes and the targets."""
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / np.float32(255)
    elif x.dtype.kind in "iu":
        x = x.astype(np.int64)
    elif x.dtype.kind != "f":
        raise DataError(f"{where}: inputs must be numbers, got {x.dtype}.")
    elif x.dtype != np.float64:
        x = x.astype(np.float32)
    if y.dtype.kind not in "iuf":
        raise DataError(f"{where}: targets must be numbers, got {y.dtype}.")
    y = y.astype(np.int64) if y.dtype.kind in "iu" else y.astype(np.promote_types(y.dtype, "f4"))
    return UserArrays(np.ascontiguousarray(x), np.ascontiguousarray(y), source=where, origin=origin)


def load_npz(
    path: str | os.PathLike[str], spec: ModelSpec | None, loss: LossSpec, metric: MetricSpec
) -> dict[str, UserArrays]:
    """The splits of an ``.npz``: ``x_train``, ``y_train`` (required), ``x_test``, ``y_test``
    (optional, both or neither). Other keys are refused (a typo would go unnoticed)."""
    where = os.fspath(path)
    arrays = read_npz(where)
    known = {k for pair in NPZ_KEYS.values() for k in pair}
    unknown = sorted(set(arrays) - known)
    if unknown:
        raise DataError(
            f"{where}: unknown arrays {unknown}; the keys are x_train, y_train and optionally "
            "x_test, y_test."
        )
    splits = {}
    for split, (xk, yk) in NPZ_KEYS.items():
        present = [k for k in (xk, yk) if k in arrays]
        if (split == "train" and len(present) < 2) or len(present) == 1:
            missing = [k for k in (xk, yk) if k not in arrays]
            raise DataError(f"{where}: has no {' or '.join(missing)} (keys: {sorted(arrays)}).")
        if present:
            origin = {"file": where, "split": split, "x": xk, "y": yk}
            pair = (arrays[xk], arrays[yk])
            splits[split] = as_split(pair, spec, loss, metric, f"{where} {xk}/{yk}", origin)
    return splits
